package skewer.realtime;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * One row of the {@code work} topic, decoded: the fixed 36-byte little-endian header of
 * pipeline/io/records.py ({@code WORK_DTYPE}), followed by a user's value or nothing.
 *
 * <pre>magic "SK" | version u8 = 1 | kind u8 | event_time_ms i64 | producer u32 | seq u64
 * | source u32 | table_version u64</pre>
 */
final class WorkRecord {
  static final int HEADER_BYTES = 36;
  static final int DATA = 0;
  static final int WATERMARK = 1;
  static final int TABLE_SWITCH = 2;
  /** Not a record of skewer's: counted as rejected, never applied. */
  static final int INVALID = -1;

  final long offset;
  final int kind;
  final byte[] key;
  final long eventTimeMs;
  final long source;
  final long tableVersion;
  /** When Kafka stamped the record (epoch ms): its latency is measured from here. */
  final long timestampMs;

  private WorkRecord(
      long offset, int kind, byte[] key, long eventTimeMs, long source, long tableVersion,
      long timestampMs) {
    this.offset = offset;
    this.kind = kind;
    this.key = key;
    this.eventTimeMs = eventTimeMs;
    this.source = source;
    this.tableVersion = tableVersion;
    this.timestampMs = timestampMs;
  }

  /**
   * The record at {@code offset}: DATA only with a key, markers whatever their key; anything
   * that is not a skewer header (short, wrong magic or version, unknown kind) is INVALID, as
   * {@code records.decode_work} and {@code worker_task.decode_partition} classify them.
   */
  static WorkRecord decode(long offset, byte[] key, byte[] value, long timestampMs) {
    if (value == null || value.length < HEADER_BYTES || value[0] != 'S' || value[1] != 'K'
        || value[2] != 1 || (value[3] & 0xff) > TABLE_SWITCH) {
      return new WorkRecord(offset, INVALID, null, 0, 0, 0, timestampMs);
    }
    ByteBuffer header = ByteBuffer.wrap(value, 0, HEADER_BYTES).order(ByteOrder.LITTLE_ENDIAN);
    int kind = value[3] & 0xff;
    if (kind == DATA && key == null) {
      return new WorkRecord(offset, INVALID, null, 0, 0, 0, timestampMs);
    }
    long eventTime = header.getLong(4);
    long source = header.getInt(24) & 0xffffffffL;
    long version = header.getLong(28);
    return new WorkRecord(offset, kind, key, eventTime, source, version, timestampMs);
  }
}
