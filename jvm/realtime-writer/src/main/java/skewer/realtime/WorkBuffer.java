package skewer.realtime;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * One worker's rows since its last apply, in offset order, and what they add up to: the ARGV
 * of the apply script (pipeline/io/redis_layout.py, {@code APPLY_SCRIPT}), built exactly as
 * {@code WorkerBatch.script_args} builds it for a micro-batch, with the guard being the rows'
 * first and last Kafka offsets instead of a batch id.
 */
final class WorkBuffer {
  private final int worker;
  private final int sources;
  private final long windowMs;
  private final List<WorkRecord> rows = new ArrayList<>();
  private long firstRowNanos;

  WorkBuffer(int worker, int sources, long windowMs) {
    this.worker = worker;
    this.sources = sources;
    this.windowMs = windowMs;
  }

  int worker() {
    return worker;
  }

  void add(WorkRecord row) {
    if (row.kind == WorkRecord.WATERMARK && row.source >= sources) {
      throw new WorkerJobError(
          "worker " + worker + " got a watermark of source " + row.source + ", but the job counts "
              + sources + " source(s): pass the right --sources");
    }
    if (rows.isEmpty()) {
      firstRowNanos = System.nanoTime();
    }
    rows.add(row);
  }

  int size() {
    return rows.size();
  }

  boolean isEmpty() {
    return rows.isEmpty();
  }

  /** How long the oldest row has waited, in nanoseconds (0 when empty). */
  long ageNanos() {
    return rows.isEmpty() ? 0 : System.nanoTime() - firstRowNanos;
  }

  void clear() {
    rows.clear();
  }

  /** Drops the rows at or below {@code applied} (another writer applied them). */
  void dropThrough(long applied) {
    rows.removeIf(row -> row.offset <= applied);
  }

  long firstOffset() {
    return rows.get(0).offset;
  }

  long lastOffset() {
    return rows.get(rows.size() - 1).offset;
  }

  /** The Kafka timestamps of the DATA rows, in arrival order: the emulated server's queue. */
  long[] dataArrivalsMs() {
    return rows.stream().filter(r -> r.kind == WorkRecord.DATA).mapToLong(r -> r.timestampMs)
        .toArray();
  }

  /**
   * ARGV of the apply script for these rows, their latency measured at {@code nowMs}: prefix,
   * worker, first offset, last offset, S, declared state fields ("": none, the writer keeps
   * counts only), n_pairs, (window, key, count) * n_pairs,
   * n_marks, (source, watermark) * n_marks, records, rejected, n_buckets, (bucket, count) *
   * n_buckets, n_switches, (source, version) * n_switches, busy-until.
   */
  List<byte[]> scriptArgs(String prefix, double nowMs, double busyUntilMs) {
    Map<Long, Map<ByteBuffer, long[]>> pairs = new TreeMap<>();
    Map<Long, Long> marks = new TreeMap<>();
    Map<Long, Long> versions = new TreeMap<>();
    Map<Long, long[]> latency = new TreeMap<>();
    long records = 0;
    long rejected = 0;
    for (WorkRecord row : rows) {
      switch (row.kind) {
        case WorkRecord.DATA:
          long window = Math.floorDiv(row.eventTimeMs, windowMs) * windowMs;
          // In (window, key bytes unsigned) order: the order of tests/vectors/apply_args.tsv.
          pairs.computeIfAbsent(window, w -> new TreeMap<>(WorkBuffer::compareKeys))
              .computeIfAbsent(ByteBuffer.wrap(row.key), k -> new long[1])[0] += 1;
          latency.computeIfAbsent(latencyBucket(nowMs - row.timestampMs), b -> new long[1])[0] += 1;
          records += 1;
          break;
        case WorkRecord.WATERMARK:
          marks.merge(row.source, row.eventTimeMs, Math::max);
          break;
        case WorkRecord.TABLE_SWITCH:
          versions.merge(row.source, row.tableVersion, Math::max);
          break;
        default:
          rejected += 1;
      }
    }
    List<byte[]> args = new ArrayList<>();
    add(args, prefix);
    add(args, worker);
    add(args, firstOffset());
    add(args, lastOffset());
    add(args, sources);
    add(args, "");
    add(args, pairs.values().stream().mapToInt(Map::size).sum());
    for (Map.Entry<Long, Map<ByteBuffer, long[]>> window : pairs.entrySet()) {
      for (Map.Entry<ByteBuffer, long[]> pair : window.getValue().entrySet()) {
        add(args, window.getKey());
        args.add(Arrays.copyOfRange(
            pair.getKey().array(), pair.getKey().arrayOffset(),
            pair.getKey().arrayOffset() + pair.getKey().limit()));
        add(args, pair.getValue()[0]);
      }
    }
    addMap(args, marks);
    add(args, records);
    add(args, rejected);
    add(args, latency.size());
    for (Map.Entry<Long, long[]> bucket : latency.entrySet()) {
      add(args, bucket.getKey());
      add(args, bucket.getValue()[0]);
    }
    addMap(args, versions);
    add(args, Double.toString(busyUntilMs));
    return args;
  }

  private static int compareKeys(ByteBuffer a, ByteBuffer b) {
    return Arrays.compareUnsigned(
        a.array(), a.arrayOffset(), a.arrayOffset() + a.limit(),
        b.array(), b.arrayOffset(), b.arrayOffset() + b.limit());
  }

  /**
   * The histogram bucket of a latency: 0 for at most 1 ms, else ceil(20 log10(ms)), as
   * {@code operators.metrics.latency_buckets} bins it.
   */
  static long latencyBucket(double latencyMs) {
    double clipped = Math.max(latencyMs, 1.0);
    return (long) Math.ceil(20.0 * Math.log10(clipped) - 1e-9);
  }

  private static void addMap(List<byte[]> args, Map<Long, Long> values) {
    add(args, values.size());
    for (Map.Entry<Long, Long> entry : values.entrySet()) {
      add(args, entry.getKey());
      add(args, entry.getValue());
    }
  }

  private static void add(List<byte[]> args, Object value) {
    args.add(String.valueOf(value).getBytes(StandardCharsets.UTF_8));
  }
}
