-- wrk script: POSTs the request body in BODY_FILE (a complete KServe v2 infer request) with
-- the headers it needs: HEADER_LENGTH set means a binary-extension body whose JSON header is
-- that long; unset means a JSON body. Counts non-200 answers and reports them.
local f = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
local hlen = os.getenv("HEADER_LENGTH")
if hlen and hlen ~= "" then
  wrk.headers["Inference-Header-Content-Length"] = hlen
  wrk.headers["Content-Type"] = "application/octet-stream"
else
  wrk.headers["Content-Type"] = "application/json"
end

local failures = 0
response = function(status, headers, body)
  if status ~= 200 then failures = failures + 1 end
end
done = function(summary, latency, requests)
  if failures > 0 then io.stderr:write("non-200 answers: " .. failures .. "\n") end
end
