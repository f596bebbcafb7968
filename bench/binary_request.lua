-- wrk script: a KServe v2 binary-extension infer request. Environment:
--   INPUT_NAME, DATATYPE, SHAPE (comma separated), BYTES (binary payload size);
--   SAGEMAKER=1 sends the JSON header size in SageMaker's content type instead.
local name = os.getenv("INPUT_NAME") or "INPUT0"
local datatype = os.getenv("DATATYPE") or "FP32"
local shape = os.getenv("SHAPE") or "1,16"
local nbytes = tonumber(os.getenv("BYTES") or "64")
local header = '{"inputs":[{"name":"' .. name .. '","shape":[' .. shape .. '],"datatype":"' ..
  datatype .. '","parameters":{"binary_data_size":' .. nbytes .. '}}],' ..
  '"parameters":{"binary_data_output":true}}'
wrk.method = "POST"
wrk.body = header .. string.rep("\0", nbytes)
if os.getenv("SAGEMAKER") == "1" then
  wrk.headers["Content-Type"] =
    "application/vnd.sagemaker-triton.binary+json;json-header-size=" .. tostring(#header)
else
  wrk.headers["Inference-Header-Content-Length"] = tostring(#header)
  wrk.headers["Content-Type"] = "application/octet-stream"
end

local failures = 0
response = function(status, headers, body)
  if status ~= 200 then
    failures = failures + 1
    if failures < 3 then io.stderr:write("HTTP " .. status .. ": " .. body .. "\n") end
  end
end
