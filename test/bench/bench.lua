-- wrk script for test/bench/bench.sh.
--
--   wrk ... -s bench.lua URL -- WORKLOAD KEYS_FILE VALUE_FILE PATH_PREFIX
--
-- WORKLOAD is get (GET hits), put (PUT of VALUE_FILE as the body) or mix
-- (90% GET, 10% PUT). Each request picks a random key from KEYS_FILE (one
-- per line; all of them preloaded). PATH_PREFIX is "/" for memcgate ("/{key}") and
-- "/key/" for nginx + memc ("/key/{key}").
--
-- Every request string is built once in init(), so request() only picks
-- one: the load generator spends its CPU on sockets, not on Lua.
--
-- done() prints one line, "BENCH key=value ...", that bench.sh parses:
-- requests, req/s, latency percentiles (µs), wrk's socket errors and the
-- responses that were not 2xx (counted in response()).
--
-- With BENCH_LUA_BODIES=0 in the environment, response() is not defined:
-- wrk then does not copy every body into Lua, which for 100 KB and 1 MB
-- values would cost the load generator more than the servers it measures.
-- non2xx is then wrk's own count of statuses above 399.

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

local gets, puts, nkeys, workload
local put_share = 0

function init(args)
  workload = args[1] or "get"
  local keys_file, value_file, prefix = args[2], args[3], args[4] or "/"
  local value
  do
    local f = assert(io.open(value_file, "rb"))
    value = f:read("*a")
    f:close()
  end
  gets, puts, nkeys = {}, {}, 0
  for key in io.lines(keys_file) do
    if key ~= "" then
      nkeys = nkeys + 1
      local path = prefix .. key
      gets[nkeys] = wrk.format("GET", path)
      puts[nkeys] = wrk.format("PUT", path, { ["Content-Type"] = "application/octet-stream" }, value)
    end
  end
  assert(nkeys > 0, "no keys in " .. keys_file)
  if workload == "get" then
    put_share = 0
  elseif workload == "put" then
    put_share = 1
  elseif workload == "mix" then
    put_share = 0.1
  else
    error("unknown workload " .. workload)
  end
  -- Thread-local counters, read by done() through thread:get().
  non2xx, sent_get, sent_put = 0, 0, 0
  math.randomseed(os.time() * 1000 + math.floor(os.clock() * 1e6))
end

function request()
  local i = math.random(nkeys)
  if put_share > 0 and (put_share >= 1 or math.random() < put_share) then
    sent_put = sent_put + 1
    return puts[i]
  end
  sent_get = sent_get + 1
  return gets[i]
end

-- wrk decides from the loaded script whether it wants responses, so the
-- choice is made here, not in init().
local count_bodies = os.getenv("BENCH_LUA_BODIES") ~= "0"
if count_bodies then
  function response(status, headers, body)
    if status < 200 or status > 299 then
      non2xx = non2xx + 1
    end
  end
end

function done(summary, latency, requests)
  local bad, ng, np = 0, 0, 0
  for _, t in ipairs(threads) do
    bad = bad + (t:get("non2xx") or 0)
    ng = ng + (t:get("sent_get") or 0)
    np = np + (t:get("sent_put") or 0)
  end
  local e = summary.errors
  if not count_bodies then
    bad = e.status
  end
  local secs = summary.duration / 1e6
  io.write(string.format(
    "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%d p90_us=%d p99_us=%d max_us=%d mean_us=%.1f " ..
    "sock_err=%d connect_err=%d read_err=%d write_err=%d timeout_err=%d status_err=%d non2xx=%d sent_get=%d sent_put=%d\n",
    summary.requests, summary.duration, summary.requests / secs,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean,
    e.connect + e.read + e.write + e.timeout, e.connect, e.read, e.write, e.timeout, e.status,
    bad, ng, np))
end
