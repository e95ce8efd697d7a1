package skewer.realtime;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

/**
 * The workers in Spark's Real-Time Mode: a {@link ForeachWriter} on {@code work}, partition w
 * being worker w, that applies each worker's rows to Redis a few milliseconds at a time.
 *
 * <p>Rows wait in a {@link WorkBuffer} until it holds {@code maxRows}, its oldest row has
 * waited {@code maxDelayMs} (a timer flushes it even when no row follows), a TABLE_SWITCH
 * marker arrives (a migration waits for the old worker to apply it), or the task ends. An
 * apply is the micro-batch path's Lua script, guarded by the rows' Kafka offsets instead of a
 * batch id: Redis applies them only beyond the offset already applied for the partition,
 * atomically with the state, so a replay after any failure (Real-Time Mode replays a whole
 * checkpoint interval) adds nothing twice. Why: docs/design.md#real-time-mode.
 *
 * <p>Rows are columns {@code partition, offset, key, value, timestamp_ms}, in this order.
 */
public final class WorkWriter extends ForeachWriter<Row> {
  private static final long serialVersionUID = 1L;

  private final RedisApplier redis;
  private final String prefix;
  private final String[] appliedKeys;
  private final String busyKey;
  private final int sources;
  private final long windowMs;
  private final double costMs;
  private final int maxRows;
  private final long maxDelayNanos;

  private transient Object lock;
  private transient WorkBuffer buffer;
  private transient long applied;
  private transient double busyUntilMs;
  private transient ScheduledExecutorService timer;
  private transient ScheduledFuture<?> ticking;
  private transient RuntimeException failed;

  /**
   * {@code appliedKeys[w]}: where Redis keeps worker w's last applied offset; {@code busyKey}:
   * the hash of each worker's emulated server's busy-until (epoch ms); {@code cpuCostUs}: the
   * CPU-cost knob (µs per record, 0: none); the other values as the micro-batch path has them.
   */
  public WorkWriter(
      String url, String sentinelService, String sentinels, String user, String password,
      int database, int replicas, String applyScript, String prefix, String[] appliedKeys,
      String busyKey, int sources, long windowMs, double cpuCostUs, int maxRows,
      double maxDelayMs) {
    this.redis = new RedisApplier(
        url, sentinelService, sentinels, user, password, database, replicas, applyScript);
    this.prefix = prefix;
    this.appliedKeys = appliedKeys.clone();
    this.busyKey = busyKey;
    this.sources = sources;
    this.windowMs = windowMs;
    this.costMs = cpuCostUs / 1000.0;
    this.maxRows = maxRows;
    this.maxDelayNanos = Math.round(maxDelayMs * 1_000_000);
  }

  @Override
  public boolean open(long partitionId, long epochId) {
    lock = new Object();
    buffer = null;
    failed = null;
    timer = Executors.newSingleThreadScheduledExecutor(runnable -> {
      Thread thread = new Thread(runnable, "skewer-writer-flush-" + partitionId);
      thread.setDaemon(true);
      return thread;
    });
    long period = Math.max(maxDelayNanos / 2, 500_000);
    ticking = timer.scheduleAtFixedRate(this::flushIfDue, period, period, TimeUnit.NANOSECONDS);
    return true;
  }

  @Override
  public void process(Row row) {
    synchronized (lock) {
      rethrow();
      int worker = row.getInt(0);
      if (buffer == null || buffer.worker() != worker) {
        startWorker(worker);
      }
      WorkRecord record = WorkRecord.decode(
          row.getLong(1), row.isNullAt(2) ? null : row.getAs(2), row.isNullAt(3) ? null : row.getAs(3),
          row.getLong(4));
      if (record.offset <= applied) {
        return; // replayed: applied before this task started
      }
      buffer.add(record);
      if (buffer.size() >= maxRows || record.kind == WorkRecord.TABLE_SWITCH) {
        flush();
      }
    }
  }

  @Override
  public void close(Throwable error) {
    if (ticking != null) {
      ticking.cancel(false);
      timer.shutdownNow();
    }
    if (error != null) {
      return; // the task failed: Spark replays its rows, the offsets keep them once
    }
    synchronized (lock) {
      rethrow();
      flush();
    }
  }

  private void startWorker(int worker) {
    if (worker < 0 || worker >= appliedKeys.length) {
      throw new WorkerJobError(
          "a task got Kafka partition " + worker + ": partition w is worker w, so every partition"
              + " must be < W=" + appliedKeys.length);
    }
    if (buffer != null) {
      flush();
    }
    buffer = new WorkBuffer(worker, sources, windowMs);
    applied = readApplied(worker);
    byte[] busy = costMs > 0 ? redis.hget(busyKey, Integer.toString(worker)) : null;
    busyUntilMs = busy == null ? 0.0 : Double.parseDouble(new String(busy, StandardCharsets.UTF_8));
  }

  private long readApplied(int worker) {
    byte[] value = redis.get(List.of(appliedKeys[worker])).get(0);
    return value == null ? -1 : Long.parseLong(new String(value, StandardCharsets.UTF_8));
  }

  private void flushIfDue() {
    synchronized (lock) {
      if (failed != null || buffer == null || buffer.ageNanos() < maxDelayNanos) {
        return;
      }
      try {
        flush();
      } catch (RuntimeException error) {
        failed = error; // the task thread throws it on its next row or at close
      }
    }
  }

  private void rethrow() {
    if (failed != null) {
      throw failed;
    }
  }

  /** Applies the buffer (under the lock): waits out the emulated server, then runs the script. */
  private void flush() {
    if (buffer == null || buffer.isEmpty()) {
      return;
    }
    double finishMs = busyUntilMs;
    if (costMs > 0) {
      finishMs = serviceFinishMs(buffer.dataArrivalsMs(), costMs, busyUntilMs);
      long waitMs = (long) Math.ceil(finishMs - System.currentTimeMillis());
      if (waitMs > 0) {
        try {
          Thread.sleep(waitMs);
        } catch (InterruptedException interrupted) {
          Thread.currentThread().interrupt();
          throw new IllegalStateException("interrupted while emulating the CPU cost", interrupted);
        }
      }
    }
    while (!buffer.isEmpty()) {
      List<byte[]> args = buffer.scriptArgs(
          prefix, System.currentTimeMillis(), costMs > 0 ? finishMs : 0.0);
      long result = redis.apply(args);
      if (result >= 0) {
        applied = buffer.lastOffset();
        buffer.clear();
      } else {
        // Another writer of this partition (a task this one replaces) applied part of the rows.
        applied = readApplied(buffer.worker());
        buffer.dropThrough(applied);
      }
    }
    busyUntilMs = finishMs;
  }

  /**
   * When a server that takes {@code costMs} per record, in arrival order, busy until
   * {@code busyUntilMs}, finishes records arriving at {@code arrivalsMs}: Lindley's recursion in
   * closed form, as {@code worker_task.service_finish_ms} computes it.
   */
  static double serviceFinishMs(long[] arrivalsMs, double costMs, double busyUntilMs) {
    if (arrivalsMs.length == 0) {
      return busyUntilMs;
    }
    long[] sorted = arrivalsMs.clone();
    java.util.Arrays.sort(sorted);
    double start = busyUntilMs;
    for (int k = 0; k < sorted.length; k++) {
      start = Math.max(start, sorted[k] - k * costMs);
    }
    return start + sorted.length * costMs;
  }
}
