-- wrk script: KServe v2 binary-extension requests carrying one encoded image each, cycling
-- through the files in IMAGE_FILES (colon separated). INPUT_NAME names the UINT8 [1, L] input.
local name = os.getenv("INPUT_NAME") or "IMAGE"
local requests = {}
local next_index = 1

init = function(args)
  local path = wrk.path
  for file in string.gmatch(os.getenv("IMAGE_FILES") or "", "[^:]+") do
    local f = assert(io.open(file, "rb"))
    local bytes = f:read("*a")
    f:close()
    local header = '{"inputs":[{"name":"' .. name .. '","shape":[1,' .. #bytes ..
      '],"datatype":"UINT8","parameters":{"binary_data_size":' .. #bytes .. '}}],' ..
      '"parameters":{"binary_data_output":true}}'
    requests[#requests + 1] = wrk.format("POST", path, {
      ["Inference-Header-Content-Length"] = tostring(#header),
      ["Content-Type"] = "application/octet-stream",
    }, header .. bytes)
  end
  assert(#requests > 0, "IMAGE_FILES names no file")
end

request = function()
  local r = requests[next_index]
  next_index = next_index % #requests + 1
  return r
end

local failures = 0
response = function(status, headers, body)
  if status ~= 200 then
    failures = failures + 1
    if failures < 3 then io.stderr:write("HTTP " .. status .. ": " .. body .. "\n") end
  end
end
