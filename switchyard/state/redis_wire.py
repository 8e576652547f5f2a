"""What the Redis store (state/redis.py) sends over the wire: its Lua scripts, run by Redis in one
round trip each, and the encodings of the records it keeps there."""

from __future__ import annotations

import orjson

from switchyard.state.base import LoadRecord, SessionRecord

# One round trip per sync tick. Key names are built from the prefix (a standalone Redis,
# not a cluster). Time comes from Redis itself so clocks of different hosts do not matter.
SYNC_LUA = """
local p, me, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local i = 4
local n = tonumber(ARGV[i]); i = i + 1
local gk = p .. 'gw:' .. me
redis.call('DEL', gk)
if n > 0 then
  local args = {}
  for j = 1, n do args[#args + 1] = ARGV[i]; args[#args + 1] = ARGV[i + 1]; i = i + 2 end
  redis.call('HSET', gk, unpack(args))
  redis.call('PEXPIRE', gk, lease)
end
redis.call('ZADD', p .. 'gws', now + lease, me)
redis.call('ZREMRANGEBYSCORE', p .. 'gws', '-inf', now)
local m = tonumber(ARGV[i]); i = i + 1
for j = 1, m do
  local b = p .. 'ctr:' .. ARGV[i]
  redis.call('HINCRBY', b, ARGV[i + 1], ARGV[i + 2])
  redis.call('PEXPIRE', b, ARGV[i + 3])
  i = i + 4
end
local nb = tonumber(ARGV[i]); i = i + 1
local totals = {}
for j = 1, nb do totals[j] = redis.call('HGETALL', p .. 'ctr:' .. ARGV[i]); i = i + 1 end
local nl = tonumber(ARGV[i]); i = i + 1
local lk = p .. 'load'
for j = 1, nl do
  local at = now - tonumber(ARGV[i + 1])
  local old = redis.call('HGET', lk, ARGV[i])
  if not old or tonumber(string.match(old, '^%-?%d+')) < at then
    redis.call('HSET', lk, ARGV[i], at .. ' ' .. ARGV[i + 2])
  end
  i = i + 3
end
local loads = redis.call('HGETALL', lk)
for j = 1, #loads, 2 do
  if tonumber(string.match(loads[j + 1], '^%-?%d+')) < now - 600000 then redis.call('HDEL', lk, loads[j]) end
end
local gws = redis.call('ZRANGE', p .. 'gws', 0, -1)
local sums, order = {}, {}
for _, g in ipairs(gws) do
  if g ~= me then
    local h = redis.call('HGETALL', p .. 'gw:' .. g)
    for j = 1, #h, 2 do
      local u = h[j]
      if sums[u] == nil then sums[u] = 0; order[#order + 1] = u end
      sums[u] = sums[u] + tonumber(h[j + 1])
    end
  end
end
local flat = {}
for _, u in ipairs(order) do flat[#flat + 1] = u; flat[#flat + 1] = sums[u] end
local rank = 0
table.sort(gws)  -- by id, not by lease expiry: every gateway sees the same order
for k, g in ipairs(gws) do if g == me then rank = k - 1 end end
return {flat, totals, redis.call('HGETALL', p .. 'circuits'), redis.call('HGETALL', p .. 'drain'), #gws, now, loads,
        rank}
"""

# A stored response and its caller's index (a sorted set of ids by expiry, ms of Redis time): the
# caller's expired ids leave the index, and past `max` its soonest-expiring (oldest) records go.
PUT_RESPONSE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, max = tonumber(ARGV[2]), tonumber(ARGV[4])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local over = redis.call('ZCARD', KEYS[2]) - max
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #old, 2 do redis.call('DEL', ARGV[5] .. old[i]) end
end
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
return over
"""

INCR_WINDOW_LUA = """
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if v == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return v
"""


def encode_session(rec: SessionRecord, expires_at: float) -> bytes:
    return orjson.dumps([rec.policy, rec.pool, rec.label, rec.confidence, rec.replica, rec.rule, rec.turns,
                         expires_at])


def decode_session(raw: bytes) -> tuple[SessionRecord, float]:
    v = orjson.loads(raw)
    return SessionRecord(v[0], v[1], v[2], float(v[3]), v[4], v[5], int(v[6])), float(v[7])


def same_session(held: SessionRecord | None, rec: SessionRecord) -> bool:
    """The local copy says what `rec` says (it keeps the confidence as a float32)."""
    return held is not None and abs(held.confidence - rec.confidence) < 1e-6 and (
        held.policy, held.pool, held.label, held.replica, held.rule, held.turns,
    ) == (rec.policy, rec.pool, rec.label, rec.replica, rec.rule, rec.turns)


def encode_load(rec: LoadRecord) -> str:
    kv = "-" if rec.kv is None else repr(rec.kv)
    return f"{rec.running!r} {rec.waiting!r} {kv} {rec.base}"


def decode_load(raw: bytes, now_ms: int) -> tuple[LoadRecord, str] | None:
    """'<read at, ms of Redis time> <running> <waiting> <kv or -> <base> <gateway id>' -> (LoadRecord,
    the id of the gateway that read it)."""
    try:
        at, running, waiting, kv, base, reader = raw.decode().split()
        return LoadRecord(float(running), float(waiting), None if kv == "-" else float(kv), int(base),
                          max(0.0, (now_ms - int(at)) / 1000.0)), reader
    except ValueError:
        return None
