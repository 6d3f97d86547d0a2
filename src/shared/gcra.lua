-- One request against one API key's rpm and tpm, across every instance: GCRA, each limit
-- kept as one theoretical arrival time (microseconds, Redis's clock), bursting to a minute's
-- worth, exactly as the local limiter (src/transport/auth/limits.rs). Both limits or neither:
-- a refusal writes nothing.
--
-- KEYS[1]  the rpm arrival time      ARGV[1]  rpm per minute (0: no rpm)
-- KEYS[2]  the tpm arrival time      ARGV[2]  tpm per minute (0: no tpm)
--                                    ARGV[3]  the request's estimated tokens
-- Returns {0, 0} when admitted, or {1 (rpm) | 2 (tpm), milliseconds to wait}.
local WINDOW = 60000000
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local function check(key, limit, cost)
  if limit <= 0 then
    return nil, 0
  end
  if cost > limit then
    cost = limit
  end
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then
    tat = now
  end
  local new = tat + (WINDOW / limit) * cost
  return new, new - (now + WINDOW)
end

local function keep(key, tat)
  -- The key lives as long as its arrival time is ahead of now: after that the bucket is full
  -- and an absent key says the same.
  local ttl = math.ceil((tat - now) / 1000) + 1
  redis.call('SET', key, string.format('%.0f', tat), 'PX', ttl)
end

local rpm_tat, rpm_over = check(KEYS[1], tonumber(ARGV[1]), 1)
if rpm_tat and rpm_over > 0 then
  return {1, math.ceil(rpm_over / 1000)}
end
local tpm_tat, tpm_over = check(KEYS[2], tonumber(ARGV[2]), tonumber(ARGV[3]))
if tpm_tat and tpm_over > 0 then
  return {2, math.ceil(tpm_over / 1000)}
end
if rpm_tat then
  keep(KEYS[1], rpm_tat)
end
if tpm_tat then
  keep(KEYS[2], tpm_tat)
end
return {0, 0}
