"""The Redis layout of a run: every key name and every Lua script, in one place.

Layer: io.

Every key of a run starts with ``skewer:{run_id}:`` (:func:`run_prefix`), so runs and tests
live side by side in one Redis; :class:`RunKeys` names each key after it, and the scripts below
(a worker's apply, a window's finalize, a producer's add-once, a migration's move and
completion) are the atomic steps the pipeline's exactness rests on. No other module spells a
key or holds Lua text (``tests/test_redis_layout.py`` checks it); the operations on these keys
are in :mod:`pipeline.io.state_store` (window state), :mod:`pipeline.io.grouping_store` (the
grouping stage's counters) and :mod:`pipeline.io.control_store` (the control plane). What each
key holds: docs/design.md#redis-layout; the scripts: docs/design.md#applying-a-micro-batch,
#closing-a-window and #migration-protocol.

Long because the scripts are whole here: one place to read every atomic step, and to check
that no other module spells a key.

Example:
    >>> keys = RunKeys("demo")
    >>> keys.state(3, 20_000), keys.wm(3), keys.windows_final
    ('skewer:demo:state:3:20000', 'skewer:demo:wm:3', 'skewer:demo:windows:final')
    >>> keys.source_stats(1), keys.ctl_table(4)
    ('skewer:demo:stats:source:1', 'skewer:demo:ctl:table:4')
"""

from __future__ import annotations

#: The first part of every key of skewer's.
KEY_ROOT = "skewer"


def run_prefix(run_id: str) -> str:
    """``skewer:{run_id}:``, the prefix of every key of run ``run_id``."""
    return f"{KEY_ROOT}:{run_id}:"


class RunKeys:
    """Names of the Redis keys of one run (``run_id`` without ':', spaces or glob characters,
    so the prefix also matches literally as a SCAN pattern)."""

    def __init__(self, run_id: str) -> None:
        if not run_id or any(c in run_id for c in ":*?[] \n"):
            raise ValueError(f"run id {run_id!r} must be non-empty, without ':', spaces or globs")
        self.run_id = run_id
        self.prefix = run_prefix(run_id)

    @property
    def pattern(self) -> str:
        """SCAN pattern of every key of the run."""
        return f"{self.prefix}*"

    # -- the producers' ground truth

    def truth(self, window: int | str) -> str:
        """Hash key -> records the producers sent for ``window`` (``"*"``: a SCAN pattern)."""
        return f"{self.prefix}truth:{window}"

    def producer_sent(self, producer: int | str) -> str:
        """Records producer ``producer`` sent (``"*"``: a SCAN pattern)."""
        return f"{self.prefix}producer:{producer}:sent"

    def producers_go(self) -> str:
        """Set once the run's workers are ready; gated producers (``skewer produce --gated``)
        wait for it after their own start-up."""
        return f"{self.prefix}producers:go"

    def added_truth(self, write_id: str, chunk: int) -> str:
        """Marker of one chunk of a producer's truth additions (:data:`ADD_ONCE_SCRIPT`)."""
        return f"{self.prefix}added:{write_id}:truth:{chunk}"

    def added_sent(self, write_id: str) -> str:
        """Marker of a producer's addition to ``producer:{p}:sent``."""
        return f"{self.prefix}added:{write_id}:sent"

    # -- window state (the workers', the aggregator's)

    def state(self, worker: int, window: int) -> str:
        """Hash key -> partial count of ``worker`` for ``window``."""
        return f"{self.prefix}state:{worker}:{window}"

    def held(self, worker: int, window: int) -> str:
        """Hash key -> count of records of a migrating key held back at its new worker."""
        return f"{self.prefix}held:{worker}:{window}"

    def field(self, index: int, worker: int, window: int) -> str:
        """Hash key -> partial value of the run's state field ``index`` (its declaration:
        :attr:`config`'s ``fields``), ``state``'s twin."""
        return f"{self.prefix}field:{index}:{worker}:{window}"

    def held_field(self, index: int, worker: int, window: int) -> str:
        """``held``'s twin for state field ``index``."""
        return f"{self.prefix}heldfield:{index}:{worker}:{window}"

    def state_family(self, kind: str) -> str:
        """SCAN pattern of every ``state``, ``held``, ``field`` or ``heldfield`` key."""
        if kind not in ("state", "held", "field", "heldfield"):
            raise ValueError(f"no partial-state family {kind!r}")
        return f"{self.prefix}{kind}:*"

    def applied(self, worker: int) -> str:
        """The last micro-batch id ``worker`` applied (in Real-Time Mode: the last Kafka offset
        of its partition)."""
        return f"{self.prefix}applied:{worker}"

    def wm(self, worker: int) -> str:
        return f"{self.prefix}wm:{worker}"

    def wm_sources(self, worker: int) -> str:
        """Hash source -> that source's latest watermark seen by ``worker``."""
        return f"{self.prefix}wm:{worker}:sources"

    def table_versions(self, worker: int) -> str:
        """Hash source -> the routing-table version of that source's last TABLE_SWITCH here."""
        return f"{self.prefix}wv:{worker}"

    @property
    def busy(self) -> str:
        """Hash worker -> when its emulated server is done with its last batch (epoch ms)."""
        return f"{self.prefix}busy"

    def result(self, window: int | str) -> str:
        """Hash key -> final count of ``window`` (``"*"``: a SCAN pattern)."""
        return f"{self.prefix}result:{window}"

    def result_field(self, index: int, window: int | str) -> str:
        """Hash key -> final value of state field ``index`` for ``window``."""
        return f"{self.prefix}resultfield:{index}:{window}"

    def topk(self, window: int | str) -> str:
        return f"{self.prefix}topk:{window}"

    @property
    def windows_open(self) -> str:
        return f"{self.prefix}windows:open"

    @property
    def windows_closed(self) -> str:
        return f"{self.prefix}windows:closed"

    @property
    def windows_final(self) -> str:
        return f"{self.prefix}windows:final"

    @property
    def windows_published(self) -> str:
        return f"{self.prefix}windows:published"

    @property
    def windows_checked(self) -> str:
        """Set of published windows checked against the truth, whose result and truth then
        expire (``skewer aggregate --keep-results``)."""
        return f"{self.prefix}windows:checked"

    @property
    def checked(self) -> str:
        """Hash of the checked windows' totals: windows, keys, truth_records, result_records,
        mismatches."""
        return f"{self.prefix}checked"

    @property
    def checked_mismatches(self) -> str:
        """List of the checked windows' first differing counts, JSON ``[window, key, truth,
        result]``."""
        return f"{self.prefix}checked:mismatches"

    @property
    def config(self) -> str:
        """Hash of the run's settings (window_ms, workers) and ``fields``, the JSON list of the
        state fields its workers keep (``[[name, part], ...]``), recorded by the first apply
        that declares them (:data:`APPLY_SCRIPT`)."""
        return f"{self.prefix}config"

    @property
    def input(self) -> str:
        """JSON of how the run reads a user's topic (:mod:`pipeline.stages.user_topic`)."""
        return f"{self.prefix}input"

    # -- counters

    def stats(self, name: str) -> str:
        """``stats:{name}``: ``records``, ``late``, ``rejected``, ``batches``, ``held`` (hashes
        worker -> count), ``windows`` (aggregator totals), ``routed`` (worker -> records),
        ``dead_letters`` (reason -> records), ``late_input`` and ``filtered_input`` (source ->
        records: late, and left out by a query's WHERE),
        ``timeline``."""
        return f"{self.prefix}stats:{name}"

    def latency(self, worker: int) -> str:
        """Hash latency bucket -> records of ``worker``."""
        return f"{self.prefix}stats:latency:{worker}"

    def source_stats(self, source: int) -> str:
        """Hash of grouping source ``source``: records, data, dead_letters, late, offset,
        started_ms."""
        return f"{self.prefix}stats:source:{source}"

    @property
    def sources_watermark(self) -> str:
        """Hash source -> the watermark it last forwarded (a user's topic)."""
        return f"{self.prefix}sources:watermark"

    # -- the control plane (pipeline.io.control_store)

    @property
    def ctl_current(self) -> str:
        """Hash version, round, migrating, and started_ms (when a controller last started)."""
        return f"{self.prefix}ctl:current"

    def ctl_report(self, round_: int, source: int) -> str:
        return f"{self.prefix}ctl:stats:{round_}:{source}"

    def ctl_table(self, version: int) -> str:
        return f"{self.prefix}ctl:table:{version}"

    def ctl_out(self, worker: int) -> str:
        """Hash key -> new worker, of the keys leaving old worker ``worker``."""
        return f"{self.prefix}ctl:out:{worker}"

    def ctl_pending(self, worker: int) -> str:
        """Set of the keys migrating to ``worker`` whose state has not arrived yet."""
        return f"{self.prefix}ctl:pending:{worker}"

    def ctl_migration(self, version: int) -> str:
        return f"{self.prefix}ctl:migration:{version}"

    def ctl_done(self, version: int) -> str:
        """Set of the old workers migration ``version`` has moved."""
        return f"{self.prefix}ctl:done:{version}"

    @property
    def ctl_rebalances(self) -> str:
        return f"{self.prefix}ctl:rebalances"

    @property
    def ctl_intervals(self) -> str:
        return f"{self.prefix}ctl:intervals"


# -- the scripts: ARGV[1] is the run's prefix, and each builds its keys from it exactly as
# -- RunKeys does above.

#: Lua the scripts that touch state fields start with: the run's declared fields (``config``'s
#: ``fields``) as their merges, an exact comparison of int64 texts (a Lua number holds 53 bits)
#: and the merge of one value into a hash field. How each part merges:
#: :data:`operators.aggregates.PART_MERGES`.
FIELDS_LUA = """
local MERGES = {count = 'add', sum = 'add', min = 'min', max = 'max'}
local function declared_merges(prefix)
  local merges = {}
  local raw = redis.call('HGET', prefix .. 'config', 'fields')
  if raw then
    for index, field in ipairs(cjson.decode(raw)) do merges[index] = MERGES[field[2]] end
  end
  return merges
end
local function less(a, b)
  local negative_a, negative_b = a:sub(1, 1) == '-', b:sub(1, 1) == '-'
  if negative_a ~= negative_b then return negative_a end
  if #a ~= #b then return (#a < #b) ~= negative_a end
  return a ~= b and ((a < b) ~= negative_a)
end
local function merge_into(hash, key, value, merge)
  if merge == 'add' then
    redis.call('HINCRBY', hash, key, value)
    return
  end
  local old = redis.call('HGET', hash, key)
  if not old then
    redis.call('HSET', hash, key, value)
    return
  end
  local wins = (merge == 'min' and less(value, old)) or (merge == 'max' and less(old, value))
  if wins then redis.call('HSET', hash, key, value) end
end
"""

#: ARGV: prefix, worker, first, last, S, declared fields (JSON ``[[name, part], ...]``, '' for
#: none), n_pairs, (window, key, count, value of each field ('' for none)) * n_pairs, n_marks,
#: (source, watermark) * n_marks, records, rejected, n_buckets, (bucket, count) * n_buckets,
#: n_switches, (source, table version) * n_switches, busy-until (ms; 0 = none).
#: Returns 1 when applied, 0 when applied before, -1 when partly applied before.
#:
#: ``first`` and ``last`` guard the apply against ``applied:{worker}``, the last one applied:
#: a micro-batch's id twice (docs/design.md#applying-a-micro-batch), or in Real-Time Mode the
#: first and last Kafka offsets of the rows (docs/design.md#real-time-mode). Rows are applied
#: only when all of them are beyond it; -1 tells a real-time writer to drop those that are not
#: and apply the rest. A call that finds them applied sets ``applied:{worker}`` again: another
#: attempt may have applied them a moment ago on the primary, and the caller's WAIT covers
#: only its own connection's writes.
#:
#: A (window, key) whose key is in ``ctl:pending:{worker}`` (it migrates here and its state has
#: not arrived yet; docs/design.md#migration-protocol) is held back: counted in
#: ``held:{worker}:{window}`` (its fields in ``heldfield:``) instead of the state, until the
#: migration moves the state here and releases it.
#:
#: The first apply that declares fields records them in ``config``; an apply that declares
#: others fails, having written nothing (a worker of another job on this run's keys).
APPLY_SCRIPT = (
    FIELDS_LUA
    + """
local prefix, worker, first, last = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local applied_key = prefix .. 'applied:' .. worker
local done = redis.call('GET', applied_key)
if done and tonumber(done) >= first then
  -- Written again, so that the WAIT after this call waits for the apply it found as well.
  redis.call('SET', applied_key, done)
  if tonumber(done) >= tonumber(last) then return 0 end
  return -1
end
local n_sources = tonumber(ARGV[5])
local closed_set = prefix .. 'windows:closed'
local merges = {}
if ARGV[6] ~= '' then
  local recorded = redis.call('HGET', prefix .. 'config', 'fields')
  if not recorded then
    redis.call('HSET', prefix .. 'config', 'fields', ARGV[6])
  elseif recorded ~= ARGV[6] then
    return redis.error_reply('skewer: the run keeps fields ' .. recorded .. ', not ' .. ARGV[6])
  end
  merges = declared_merges(prefix)
end
local width = 3 + #merges
local i = 7
local n_pairs = tonumber(ARGV[i]); i = i + 1
local late, held = 0, 0
local closed = {}
local pending_key = prefix .. 'ctl:pending:' .. worker
local migrating = redis.call('SCARD', pending_key) > 0
for _ = 1, n_pairs do
  local window, key, count, values = ARGV[i], ARGV[i + 1], ARGV[i + 2], i + 2
  i = i + width
  if closed[window] == nil then
    closed[window] = redis.call('SISMEMBER', closed_set, window) == 1
    if not closed[window] then redis.call('SADD', prefix .. 'windows:open', window) end
  end
  local state, fields = 'state:', 'field:'
  if closed[window] then
    late = late + tonumber(count)
    state = nil
  elseif migrating and redis.call('SISMEMBER', pending_key, key) == 1 then
    state, fields = 'held:', 'heldfield:'
    held = held + tonumber(count)
  end
  if state then
    local suffix = worker .. ':' .. window
    redis.call('HINCRBY', prefix .. state .. suffix, key, count)
    for f = 1, #merges do
      local value = ARGV[values + f]
      if value ~= '' then
        merge_into(prefix .. fields .. (f - 1) .. ':' .. suffix, key, value, merges[f])
      end
    end
  end
end
local n_marks = tonumber(ARGV[i]); i = i + 1
local sources_key = prefix .. 'wm:' .. worker .. ':sources'
for _ = 1, n_marks do
  local source, mark = ARGV[i], ARGV[i + 1]
  i = i + 2
  local old = redis.call('HGET', sources_key, source)
  if (not old) or tonumber(old) < tonumber(mark) then
    redis.call('HSET', sources_key, source, mark)
  end
end
if n_marks > 0 and redis.call('HLEN', sources_key) >= n_sources then
  local low = nil
  for _, mark in ipairs(redis.call('HVALS', sources_key)) do
    if low == nil or tonumber(mark) < tonumber(low) then low = mark end
  end
  redis.call('SET', prefix .. 'wm:' .. worker, low)
end
local records, rejected = ARGV[i], ARGV[i + 1]
i = i + 2
redis.call('HINCRBY', prefix .. 'stats:records', worker, records)
if tonumber(rejected) > 0 then
  redis.call('HINCRBY', prefix .. 'stats:rejected', worker, rejected)
end
if late > 0 then redis.call('HINCRBY', prefix .. 'stats:late', worker, late) end
local n_buckets = tonumber(ARGV[i]); i = i + 1
for _ = 1, n_buckets do
  redis.call('HINCRBY', prefix .. 'stats:latency:' .. worker, ARGV[i], ARGV[i + 1])
  i = i + 2
end
local n_switches = tonumber(ARGV[i]); i = i + 1
local versions_key = prefix .. 'wv:' .. worker
for _ = 1, n_switches do
  local source, version = ARGV[i], ARGV[i + 1]
  i = i + 2
  local old = redis.call('HGET', versions_key, source)
  if (not old) or tonumber(old) < tonumber(version) then
    redis.call('HSET', versions_key, source, version)
  end
end
if tonumber(ARGV[i]) > 0 then redis.call('HSET', prefix .. 'busy', worker, ARGV[i]) end
if held > 0 then
  redis.call('HINCRBY', prefix .. 'stats:held', worker, held)
  local migration = redis.call('HGET', prefix .. 'ctl:current', 'migrating')
  if migration and migration ~= '' then
    local record = prefix .. 'ctl:migration:' .. migration
    redis.call('HINCRBY', record, 'held_records', held)
    -- When the first record was held: a record waits at most until the migration completes.
    local now = redis.call('TIME')
    redis.call('HSETNX', record, 'first_held_ms', now[1] * 1000 + math.floor(now[2] / 1000))
  end
end
redis.call('HINCRBY', prefix .. 'stats:batches', worker, 1)
redis.call('SET', applied_key, last)
return 1
"""
)

#: ARGV: prefix, window, W, top-k JSON, records, state entries, n_keys, (key, count) * n_keys,
#: then for each declared field: n, (key, value) * n. Returns 1 when finalized now, 0 when the
#: window was final already.
FINALIZE_SCRIPT = (
    FIELDS_LUA
    + """
local prefix, window = ARGV[1], ARGV[2]
if redis.call('SISMEMBER', prefix .. 'windows:final', window) == 1 then return 0 end
-- HSET in chunks: unpack() of the whole ARGV could overflow Lua's C stack.
local function write(hash, first, n)
  redis.call('DEL', hash)
  local last, chunk = first + 2 * n - 1, 1000
  for start = first, last, chunk do
    redis.call('HSET', hash, unpack(ARGV, start, math.min(start + chunk - 1, last)))
  end
  return last + 1
end
local n_keys = tonumber(ARGV[7])
local merges = declared_merges(prefix)
local after = write(prefix .. 'result:' .. window, 8, n_keys)
for f = 1, #merges do
  local hash = prefix .. 'resultfield:' .. (f - 1) .. ':' .. window
  after = write(hash, after + 1, tonumber(ARGV[after]))
end
redis.call('SET', prefix .. 'topk:' .. window, ARGV[4])
for worker = 0, tonumber(ARGV[3]) - 1 do
  local suffix = worker .. ':' .. window
  redis.call('DEL', prefix .. 'state:' .. suffix, prefix .. 'held:' .. suffix)
  for f = 1, #merges do
    redis.call('DEL', prefix .. 'field:' .. (f - 1) .. ':' .. suffix,
               prefix .. 'heldfield:' .. (f - 1) .. ':' .. suffix)
  end
end
redis.call('SADD', prefix .. 'windows:final', window)
redis.call('SREM', prefix .. 'windows:open', window)
local totals = prefix .. 'stats:windows'
redis.call('HINCRBY', totals, 'windows', 1)
redis.call('HINCRBY', totals, 'records', ARGV[5])
redis.call('HINCRBY', totals, 'state_entries', ARGV[6])
redis.call('HINCRBY', totals, 'distinct_keys', n_keys)
return 1
"""
)

#: KEYS[1]: the write's marker; ARGV: (key, field, amount) * n, field '' for a plain counter.
#: Returns 1 when added now, 0 when the marker was there (added before).
ADD_ONCE_SCRIPT = """
if not redis.call('SET', KEYS[1], 1, 'NX') then return 0 end
for i = 1, #ARGV, 3 do
  if ARGV[i + 1] == '' then
    redis.call('INCRBY', ARGV[i], ARGV[i + 2])
  else
    redis.call('HINCRBY', ARGV[i], ARGV[i + 1], ARGV[i + 2])
  end
end
return 1
"""

#: ARGV: prefix, window, seconds to keep, keys, truth records, result records, mismatches,
#: mismatch rows kept at most, then JSON mismatch rows. Records a published window's check
#: against the truth once (0 if it was already) and lets its result, fields, top-k and truth
#: expire: the run's totals keep what verify needs.
RETIRE_WINDOW_SCRIPT = (
    FIELDS_LUA
    + """
local prefix, window, keep = ARGV[1], ARGV[2], ARGV[3]
if redis.call('SADD', prefix .. 'windows:checked', window) == 0 then return 0 end
local totals = prefix .. 'checked'
redis.call('HINCRBY', totals, 'windows', 1)
redis.call('HINCRBY', totals, 'keys', ARGV[4])
redis.call('HINCRBY', totals, 'truth_records', ARGV[5])
redis.call('HINCRBY', totals, 'result_records', ARGV[6])
redis.call('HINCRBY', totals, 'mismatches', ARGV[7])
local rows = prefix .. 'checked:mismatches'
for i = 9, #ARGV do
  if redis.call('LLEN', rows) < tonumber(ARGV[8]) then redis.call('RPUSH', rows, ARGV[i]) end
end
for _, family in ipairs({'result:', 'topk:', 'truth:'}) do
  redis.call('EXPIRE', prefix .. family .. window, keep)
end
for f = 1, #declared_merges(prefix) do
  redis.call('EXPIRE', prefix .. 'resultfield:' .. (f - 1) .. ':' .. window, keep)
end
return 1
"""
)

#: ARGV: prefix, old worker a, version, S, END_OF_STREAM. Returns {status, keys, entries,
#: bytes, released, waiting source}; see :class:`pipeline.io.control_store.MoveResult`.
MIGRATE_SCRIPT = (
    FIELDS_LUA
    + """
local prefix, a, version = ARGV[1], ARGV[2], ARGV[3]
local n_sources, eos = tonumber(ARGV[4]), ARGV[5]
local migration = prefix .. 'ctl:migration:' .. version
if redis.call('HGET', migration, 'phase') ~= 'running' then return {-1, 0, 0, 0, 0, -1} end
local done = prefix .. 'ctl:done:' .. version
if redis.call('SISMEMBER', done, a) == 1 then return {0, 0, 0, 0, 0, -1} end
local versions = {}
local raw = redis.call('HGETALL', prefix .. 'wv:' .. a)
for i = 1, #raw, 2 do versions[raw[i]] = tonumber(raw[i + 1]) end
local ended = {}
raw = redis.call('HGETALL', prefix .. 'wm:' .. a .. ':sources')
for i = 1, #raw, 2 do if raw[i + 1] == eos then ended[raw[i]] = true end end
for s = 0, n_sources - 1 do
  local name = tostring(s)
  if not ended[name] and (versions[name] == nil or versions[name] < tonumber(version)) then
    return {-2, 0, 0, 0, 0, s}
  end
end
local windows = redis.call('SDIFF', prefix .. 'windows:open', prefix .. 'windows:closed')
local merges = declared_merges(prefix)
if redis.call('HEXISTS', migration, 'state_entries_total') == 0 then
  local total = 0
  for _, window in ipairs(windows) do
    for w = 0, tonumber(redis.call('HGET', migration, 'workers')) - 1 do
      total = total + redis.call('HLEN', prefix .. 'state:' .. w .. ':' .. window)
    end
  end
  redis.call('HSET', migration, 'state_entries_total', total)
end
local out = prefix .. 'ctl:out:' .. a
local moves = redis.call('HGETALL', out)
local keys, entries, bytes, released = 0, 0, 0, 0
for i = 1, #moves, 2 do
  local key, b = moves[i], moves[i + 1]
  for _, window in ipairs(windows) do
    local from = prefix .. 'state:' .. a .. ':' .. window
    local to = prefix .. 'state:' .. b .. ':' .. window
    local count = redis.call('HGET', from, key)
    if count then
      redis.call('HINCRBY', to, key, count)
      redis.call('HDEL', from, key)
      entries = entries + 1
      bytes = bytes + #key + #count
    end
    local held_key = prefix .. 'held:' .. b .. ':' .. window
    local held = redis.call('HGET', held_key, key)
    if held then
      redis.call('HINCRBY', to, key, held)
      redis.call('HDEL', held_key, key)
      released = released + tonumber(held)
    end
    -- The key's fields travel beside its count, each merged as it merges.
    for f = 1, #merges do
      local family = (f - 1) .. ':'
      local to_field = prefix .. 'field:' .. family .. b .. ':' .. window
      for _, from_field in ipairs({prefix .. 'field:' .. family .. a .. ':' .. window,
                                   prefix .. 'heldfield:' .. family .. b .. ':' .. window}) do
        local value = redis.call('HGET', from_field, key)
        if value then
          merge_into(to_field, key, value, merges[f])
          redis.call('HDEL', from_field, key)
          bytes = bytes + #value
        end
      end
    end
  end
  redis.call('SREM', prefix .. 'ctl:pending:' .. b, key)
  keys = keys + 1
end
redis.call('DEL', out)
redis.call('SADD', done, a)
redis.call('HINCRBY', migration, 'keys_moved', keys)
redis.call('HINCRBY', migration, 'state_entries_moved', entries)
redis.call('HINCRBY', migration, 'state_bytes_moved', bytes)
redis.call('HINCRBY', migration, 'released_records', released)
return {1, keys, entries, bytes, released, -1}
"""
)

#: ARGV: prefix, version, completed_ms, history length, seconds the migration's record and
#: done set are kept. Returns 1 when completed now, 0 when not all old workers have moved yet
#: or the migration is not running.
COMPLETE_SCRIPT = """
local prefix, version = ARGV[1], ARGV[2]
local migration = prefix .. 'ctl:migration:' .. version
if redis.call('HGET', migration, 'phase') ~= 'running' then return 0 end
local needed = tonumber(redis.call('HGET', migration, 'from_workers'))
if redis.call('SCARD', prefix .. 'ctl:done:' .. version) < needed then return 0 end
local published = tonumber(redis.call('HGET', migration, 'published_ms'))
local completed = tonumber(ARGV[3])
local first_held = tonumber(redis.call('HGET', migration, 'first_held_ms') or ARGV[3])
redis.call('HSET', migration, 'phase', 'done', 'completed_ms', ARGV[3],
           'duration_s', (completed - published) / 1000.0,
           'longest_hold_s', math.max(completed - first_held, 0) / 1000.0)
redis.call('HSET', prefix .. 'ctl:current', 'migrating', '')
local record = {}
local raw = redis.call('HGETALL', migration)
for i = 1, #raw, 2 do record[raw[i]] = tonumber(raw[i + 1]) or raw[i + 1] end
redis.call('RPUSH', prefix .. 'ctl:rebalances', cjson.encode(record))
redis.call('LTRIM', prefix .. 'ctl:rebalances', -tonumber(ARGV[4]), -1)
redis.call('EXPIRE', migration, ARGV[5])
redis.call('EXPIRE', prefix .. 'ctl:done:' .. version, ARGV[5])
return 1
"""
