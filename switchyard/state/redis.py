"""StateStore on Redis (redis.asyncio + hiredis): several gateways, one view.

What is shared and how:
- sessions: one key each (`<prefix>sess:<policy>\\0<id>`) with the policy's TTL; read on the
  request path (one GET), written behind (pipelined by one writer task, never awaited by a request);
- in-flight counts: each gateway publishes its counts per replica as a lease (a hash that
  expires after `lease_ttl`) and reads the sum of everyone else's, in one Lua call per sync
  tick (pools/sync.py); a gateway that dies stops renewing and its counts vanish with the lease;
- circuits and drains: hashes keyed by replica URL, read back by the same Lua call;
- rate-limit counters: one hash per time window (HINCRBY per key), added to and read back
  whole in the same Lua call, so every gateway learns every key's total each tick;
- replicas' own load readings (strategy least_load): one hash field per replica URL, the latest
  reading any gateway took, written and read back in the same Lua call (its time is Redis' clock).

Outage: every command has a short socket timeout and no retry. The first failure marks the
store down; from then on nothing touches Redis on the request path (the local MemoryStore
answers) and a prober pings every `probe_interval`. When Redis answers again, what was
written locally meanwhile (sessions, open circuits, drains) is pushed back, then it is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import OrderedDict

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from switchyard.state.base import (
    MAX_RESPONSES_PER_CALLER,
    CircuitRecord,
    CounterDelta,
    LoadRecord,
    SessionRecord,
    SharedView,
)
from switchyard.state.memory import MemoryStore
from switchyard.state.redis_wire import (
    INCR_WINDOW_LUA,
    PUT_RESPONSE_LUA,
    SYNC_LUA,
    decode_load,
    decode_session,
    encode_load,
    encode_session,
    same_session,
)

log = logging.getLogger("switchyard.state.redis")

ERRORS = (RedisError, OSError, TimeoutError, asyncio.TimeoutError)
MAX_PENDING = 100_000  # queued writes kept while the writer is behind; beyond it, the oldest go
MAX_DIRTY = 100_000  # ids written (or deleted) during an outage, pushed back on recovery; beyond it, the oldest go
FLUSH_SLACK_S = 0.25  # a flush's wait beyond its two batches' timeouts: the event loop's own delays under load

class RedisStore:
    kind = "redis"
    shared = True

    def __init__(self, url: str, *, prefix: str = "switchyard:", timeout: float = 0.1, lease_ttl: float = 3.0,
                 probe_interval: float = 0.5, gateway_id: str | None = None, local: MemoryStore | None = None,
                 max_responses_per_caller: int = MAX_RESPONSES_PER_CALLER):
        self.url = url
        self.prefix = prefix
        self.lease_ttl = lease_ttl
        self.probe_interval = probe_interval
        self.timeout = timeout
        self.id = gateway_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        # No retries and short timeouts: a dead Redis costs one failed call, then the store is down.
        self.redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
            health_check_interval=0, client_name=f"switchyard-{self.id}",
        )
        self._sync_script = self.redis.register_script(SYNC_LUA)
        self._incr_script = self.redis.register_script(INCR_WINDOW_LUA)
        self._put_response_script = self.redis.register_script(PUT_RESPONSE_LUA)
        # What this gateway keeps itself: sessions read or written here (served from it while Redis
        # is away) and its own stored responses, under the local store's bounds.
        self.local = local or MemoryStore()
        self.max_responses_per_caller = max_responses_per_caller
        self.up = True
        self.error = ""
        self.down_since: float | None = None
        self.outages = 0
        # Responses that went out before their session writes reached Redis (flush gave up): the
        # next turn through another gateway may read the state from before them.
        self.late_flushes = 0
        self.gateways = 1
        self._queue: list[tuple] = []
        self._wake: asyncio.Event | None = None
        self._seq = 0  # writes queued so far
        self._done_seq = 0  # writes sent (or given up on) so far
        self._batch: asyncio.Future | None = None  # resolves when the batch being sent is done
        self._reads: list[tuple[str, asyncio.Future]] = []  # session reads waiting for the next MGET
        self._reading = 0  # session reads on the wire
        self._writer: asyncio.Task | None = None
        self._prober: asyncio.Task | None = None
        self._dirty_sessions: OrderedDict[str, None] = OrderedDict()  # an ordered set, bounded by MAX_DIRTY
        self._dirty_drains: set[str] = set()
        self._dirty_responses: OrderedDict[tuple[str, str], bool] = OrderedDict()  # (caller, id) -> put (or deleted)
        self._closing = False

    # --- keys -------------------------------------------------------------------------------

    def _skey(self, sid: str) -> str:
        return f"{self.prefix}sess:{sid}"

    def _rkey_prefix(self, caller: str) -> str:
        return f"{self.prefix}resp:{caller}\0"

    def _ridx(self, caller: str) -> str:
        return f"{self.prefix}respidx:{caller}"

    def _dirty_session(self, sid: str) -> None:
        self._dirty_sessions[sid] = None
        if len(self._dirty_sessions) > MAX_DIRTY:  # an outage of days: the oldest are lost to Redis
            self._dirty_sessions.popitem(last=False)

    def _dirty_response(self, caller: str, response_id: str, put: bool) -> None:
        self._dirty_responses.pop((caller, response_id), None)
        self._dirty_responses[(caller, response_id)] = put
        if len(self._dirty_responses) > MAX_DIRTY:
            self._dirty_responses.popitem(last=False)

    # --- health -----------------------------------------------------------------------------

    def _down(self, e: BaseException) -> None:
        if self.up:
            self.up = False
            self.outages += 1
            self.down_since = time.time()
            self.error = f"{type(e).__name__}: {e}"[:300]
            log.warning("Redis unreachable (%s): serving on local state until it answers again", self.error)
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe(), name="redis-probe")

    async def _probe(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.probe_interval)
            try:
                # Connections opened before the outage are dead or hold unread replies: start afresh,
                # or the first commands after recovery would fail one by one and flap the store.
                await self.redis.connection_pool.disconnect()
                await self.redis.ping()
                await self._resync()
            except ERRORS as e:
                self.error = f"{type(e).__name__}: {e}"[:300]
                continue
            self.up = True
            log.warning("Redis answers again after %.1fs: shared state resumed", time.time() - (self.down_since or 0))
            self.down_since = None
            self.error = ""
            return

    async def _resync(self) -> None:
        """Push back what this gateway wrote while Redis was away (its leases follow at the next sync)."""
        pipe = self.redis.pipeline(transaction=False)
        now = time.time()
        for sid in list(self._dirty_sessions):
            rec = self.local.get_session_now(sid)
            left = self.local.expiry(sid)
            if rec is not None and left:
                pipe.set(self._skey(sid), encode_session(rec, now + left), px=max(1, int(left * 1000)))
        for url, c in self.local.circuits().items():
            if c.state == "open" and c.until > now:
                pipe.hset(self.prefix + "circuits", url, orjson.dumps([c.until, c.reason]))
        drains = self.local.drains()
        for url in list(self._dirty_drains):
            if url in drains:
                pipe.hset(self.prefix + "drain", url, drains[url])
            else:
                pipe.hdel(self.prefix + "drain", url)
        await pipe.execute()
        self._dirty_sessions.clear()
        self._dirty_drains.clear()
        for (caller, rid), put in list(self._dirty_responses.items()):
            if put:
                rec = self.local.get_response_now(caller, rid)
                left = self.local.response_expiry(caller, rid)
                if rec is not None and left:
                    await self._store_response(caller, rid, rec, left)
            else:
                await self._drop_response(caller, rid)
            del self._dirty_responses[(caller, rid)]

    def healthy(self) -> bool:
        return self.up

    def describe(self) -> dict:
        out: dict = {"kind": self.kind, "healthy": self.up, "shared": True, "gateway_id": self.id,
                     "gateways": self.gateways, "outages": self.outages, "late_flushes": self.late_flushes,
                     "local": self.local.held() | {"dirty": len(self._dirty_sessions) + len(self._dirty_responses),
                                                   "pending_writes": len(self._queue)}}
        if not self.up:
            out["error"] = self.error
            out["down_for_s"] = round(time.time() - (self.down_since or time.time()), 1)
            out["serving_on"] = "local state"
        return out

    # --- write-behind -----------------------------------------------------------------------

    def _enqueue(self, op: tuple) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
            self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="redis-writer")
        if len(self._queue) >= MAX_PENDING:
            del self._queue[: len(self._queue) // 2]
        self._queue.append(op)
        self._seq += 1
        self._wake.set()

    async def _write_loop(self) -> None:
        assert self._wake is not None
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            ops, self._queue = self._queue, []
            upto = self._seq
            batch = self._batch = asyncio.get_running_loop().create_future()
            try:
                if ops:
                    if self.up:
                        await self._flush(ops)
                    else:
                        self._mark_dirty(ops)
            except Exception:  # a bug must not stop every later write
                log.exception("Redis write-behind failed")
                self._mark_dirty(ops)
            finally:
                self._done_seq = upto
                batch.set_result(None)

    async def flush(self) -> None:
        """Wait (briefly) until the writes queued so far reached Redis: called before a response goes
        out, so the client's next request, through any gateway, sees its session. The write began
        when the decision was made, so it is usually done by now and this costs nothing."""
        target = self._seq
        if self._done_seq >= target or not self.up:
            return
        loop = asyncio.get_running_loop()
        # Our writes go out in the batch after the one in flight at worst, and each batch's round
        # trip is bounded by the socket timeout (a slower one marks the store down, which ends this
        # wait): two timeouts, plus room for a busy loop's turns. One timeout from here gave up on
        # writes that were still on time (a session's next turn, through another worker, then read
        # its pin before it landed).
        deadline = loop.time() + 2 * self.timeout + FLUSH_SLACK_S
        while self._done_seq < target and self.up and loop.time() <= deadline:
            batch = self._batch
            if batch is None or batch.done():
                await asyncio.sleep(0)  # the writer has not picked the queue up yet
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(batch), max(0.0, deadline - loop.time()))
        if self._done_seq < target and self.up:
            self.late_flushes += 1

    async def _flush(self, ops: list[tuple]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for op in ops:
            if op[0] == "set":
                pipe.set(op[1], op[2], px=op[3])
            elif op[0] == "hset":
                pipe.hset(op[1], op[2], op[3])
            elif op[0] == "hdel":
                pipe.hdel(op[1], op[2])
        try:
            await pipe.execute()
        except ERRORS as e:
            self._down(e)
            self._mark_dirty(ops)

    def _mark_dirty(self, ops: list[tuple]) -> None:
        plen = len(self.prefix + "sess:")
        for op in ops:
            if op[0] == "set":
                self._dirty_session(op[1][plen:])

    # --- sessions ---------------------------------------------------------------------------

    def _read(self, key: str) -> asyncio.Future:
        """Session reads issued in one event-loop turn go out as one MGET: under load this shares
        redis-py's per-command cost (~0.1-0.2 ms of CPU) among the requests; alone it adds a turn."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self._reads:
            loop.call_soon(self._send_reads)
        self._reads.append((key, fut))
        return fut

    def _send_reads(self) -> None:
        batch, self._reads = self._reads, []
        if batch:
            asyncio.get_running_loop().create_task(self._mget(batch))

    async def _mget(self, batch: list[tuple[str, asyncio.Future]]) -> None:
        self._reading += 1
        try:
            if len(batch) == 1:
                values = [await self.redis.get(batch[0][0])]
            else:
                values = await self.redis.mget([k for k, _ in batch])
        except ERRORS as e:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        except BaseException as e:  # cancelled at shutdown: nobody may wait forever
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(RedisError(f"read abandoned: {type(e).__name__}"))
            raise
        finally:
            self._reading -= 1
        for (_, fut), v in zip(batch, values, strict=True):
            if not fut.done():
                fut.set_result(v)

    async def _get(self, key: str) -> bytes | None:
        if self._reading:  # others are waiting on Redis already: join the next batch
            return await self._read(key)
        self._reading += 1  # alone: straight to Redis, no extra loop turn
        try:
            return await self.redis.get(key)
        finally:
            self._reading -= 1

    async def get_session(self, session_id: str) -> SessionRecord | None:
        if self.up:
            try:
                raw = await self._get(self._skey(session_id))
            except ERRORS as e:
                self._down(e)
            else:
                if raw is not None:
                    rec, expires_at = decode_session(raw)
                    left = expires_at - time.time()
                    if left > 0:
                        self.local.put_session_now(session_id, rec, left)  # kept for an outage
                        return rec
                    return None
        # Down, or not in Redis yet (written behind a moment ago, or during an outage): local copy.
        return self.local.get_session_now(session_id)

    async def put_session(self, session_id: str, record: SessionRecord, ttl: float) -> None:
        left = self.local.expiry(session_id)
        if left is not None and ttl - left < min(ttl * 0.05, 30.0) \
                and same_session(self.local.get_session_now(session_id), record):
            # Unchanged and written a moment ago: refreshing the TTL can wait (a session lives at
            # most min(5%, 30 s) less), which keeps a busy session's turns to one Redis read each.
            return
        self.local.put_session_now(session_id, record, ttl)
        if self.up:
            self._enqueue(("set", self._skey(session_id), encode_session(record, time.time() + ttl),
                           max(1, int(ttl * 1000))))
        else:
            self._dirty_session(session_id)

    async def list_sessions(self, limit: int = 100) -> dict[str, SessionRecord]:
        if not self.up:
            return await self.local.list_sessions(limit)
        out: dict[str, SessionRecord] = {}
        plen = len(self.prefix + "sess:")
        try:
            keys = []
            async for k in self.redis.scan_iter(match=self.prefix + "sess:*", count=1000):
                keys.append(k)
                if len(keys) >= limit:
                    break
            if keys:
                for k, raw in zip(keys, await self.redis.mget(keys), strict=True):
                    if raw is not None:
                        out[k.decode("utf-8", "replace")[plen:]] = decode_session(raw)[0]
        except ERRORS as e:
            self._down(e)
            return await self.local.list_sessions(limit)
        return out

    # --- stored responses -------------------------------------------------------------------

    async def _store_response(self, caller: str, response_id: str, record: bytes, ttl: float) -> None:
        pre = self._rkey_prefix(caller)
        await self._put_response_script(keys=[pre + response_id, self._ridx(caller)],
                                        args=[record, max(1, int(ttl * 1000)), response_id,
                                              self.max_responses_per_caller, pre])

    async def _drop_response(self, caller: str, response_id: str) -> bool:
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(self._rkey_prefix(caller) + response_id)
        pipe.zrem(self._ridx(caller), response_id)
        gone, _ = await pipe.execute()
        return bool(gone)

    async def put_response(self, caller: str, response_id: str, record: bytes, ttl: float) -> None:
        # Kept here too: this gateway's own chains go on through an outage. Awaited (one round
        # trip, the short timeout) rather than written behind, so the client's next request, through
        # any gateway, finds it.
        if not self.local.put_response_now(caller, response_id, record, ttl):
            return  # over the size cap (logged)
        if self.up:
            try:
                await self._store_response(caller, response_id, record, ttl)
                return
            except ERRORS as e:
                self._down(e)
        self._dirty_response(caller, response_id, True)

    async def get_response(self, caller: str, response_id: str) -> bytes | None:
        if self.up:
            try:
                raw = await self._get(self._rkey_prefix(caller) + response_id)
            except ERRORS as e:
                self._down(e)
            else:
                if raw is None:  # gone from Redis (deleted through another gateway, evicted, expired)
                    await self.local.delete_response(caller, response_id)
                return raw
        return self.local.get_response_now(caller, response_id)

    async def delete_response(self, caller: str, response_id: str) -> bool:
        here = await self.local.delete_response(caller, response_id)
        if self.up:
            try:
                return await self._drop_response(caller, response_id) or here
            except ERRORS as e:
                self._down(e)
        self._dirty_response(caller, response_id, False)
        return here

    # --- circuits and drains ----------------------------------------------------------------

    async def get_circuit(self, replica: str) -> CircuitRecord | None:
        if self.up:
            try:
                raw = await self.redis.hget(self.prefix + "circuits", replica)
            except ERRORS as e:
                self._down(e)
            else:
                if raw is None:
                    return None
                until, reason = orjson.loads(raw)
                return CircuitRecord("open" if until > time.time() else "closed", until, reason)
        return await self.local.get_circuit(replica)

    async def put_circuit(self, replica: str, record: CircuitRecord) -> None:
        await self.local.put_circuit(replica, record)
        if self.up:
            if record.state == "open":
                self._enqueue(("hset", self.prefix + "circuits", replica, orjson.dumps([record.until, record.reason])))
            else:
                self._enqueue(("hdel", self.prefix + "circuits", replica))

    async def put_drain(self, replica: str, state: str | None) -> None:
        await self.local.put_drain(replica, state)
        if self.up:
            try:
                if state is None:
                    await self.redis.hdel(self.prefix + "drain", replica)
                else:
                    await self.redis.hset(self.prefix + "drain", replica, state)
                return
            except ERRORS as e:
                self._down(e)
        self._dirty_drains.add(replica)

    # --- counters and the sync tick ---------------------------------------------------------

    async def incr_window(self, key: str, amount: int, window: float) -> int:
        if self.up:
            idx = int(time.time() // window)
            try:
                return int(await self._incr_script(keys=[f"{self.prefix}ctr:{key}:{idx}"],
                                                   args=[amount, int(window * 2000)]))
            except ERRORS as e:
                self._down(e)
        return await self.local.incr_window(key, amount, window)

    async def sync(self, inflight: dict[str, int], counters: list[CounterDelta],
                   buckets: list[str], loads: dict[str, LoadRecord] | None = None) -> SharedView | None:
        if not self.up:
            return None
        args: list = [self.prefix, self.id, int(self.lease_ttl * 1000), len(inflight)]
        for url, n in inflight.items():
            args += (url, n)
        args.append(len(counters))
        for c in counters:
            args += c
        args.append(len(buckets))
        args += buckets
        loads = loads or {}
        args.append(len(loads))
        for url, rec in loads.items():  # the reading's time becomes Redis' own clock less its age
            args += (url, int(rec.age * 1000), f"{encode_load(rec)} {self.id}")
        try:
            flat, totals, circuits, drains, gateways, now, raw_loads, rank = await self._sync_script(args=args)
        except ERRORS as e:
            self._down(e)
            return None
        view = SharedView(gateways=int(gateways), rank=int(rank))
        self.gateways = view.gateways
        for i in range(0, len(flat), 2):
            view.inflight[flat[i].decode()] = int(flat[i + 1])
        for bucket, flat_b in zip(buckets, totals, strict=True):
            view.counters[bucket] = {flat_b[j].decode(): int(flat_b[j + 1]) for j in range(0, len(flat_b), 2)}
        wall = time.time()
        for i in range(0, len(circuits), 2):
            until, reason = orjson.loads(circuits[i + 1])
            if until > wall:
                view.circuits[circuits[i].decode()] = CircuitRecord("open", until, reason)
        for i in range(0, len(drains), 2):
            view.drains[drains[i].decode()] = drains[i + 1].decode()
        for i in range(0, len(raw_loads), 2):
            got = decode_load(raw_loads[i + 1], int(now))
            if got is not None and got[1] != self.id:  # this gateway's own readings: it has them already
                view.loads[raw_loads[i].decode()] = got[0]
        return view

    async def aclose(self) -> None:
        self._closing = True
        ops, self._queue = self._queue, []
        if ops and self.up:
            await self._flush(ops)
        for t in (self._writer, self._prober):
            if t is not None:
                t.cancel()
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
        if self.up:
            try:  # leave now rather than when the lease runs out
                await self.redis.delete(f"{self.prefix}gw:{self.id}")
                await self.redis.zrem(self.prefix + "gws", self.id)
            except ERRORS:
                pass
        await self.redis.aclose()
