package skewer.sketch;

/**
 * The log-linear bucket index of an exact decimal (a long in millionths), bit for bit the one
 * of {@code operators/sketches/log_buckets.py}: a magnitude below 2^(SUB_BITS+1) is a bucket of
 * its own; above, with e = floor(log2 |v|), the bucket is the top SUB_BITS + 1 bits,
 * {@code (e - SUB_BITS + 1) * 2^SUB_BITS + (|v| >> (e - SUB_BITS)) - 2^SUB_BITS}, signed as v.
 * Integer arithmetic only, so both languages agree on every value ({@code
 * tests/vectors/log_buckets.tsv}). Why these buckets: docs/query.md.
 */
public final class LogBuckets {
  /** Sub-buckets per power of two: 2^7. */
  public static final int SUB_BITS = 7;

  private static final long SUB = 1L << SUB_BITS;

  private LogBuckets() {}

  /** The bucket index of {@code value} ({@code |value| < 2^62}). */
  public static long index(long value) {
    long magnitude = Math.abs(value);
    long index;
    if (magnitude < 2 * SUB) {
      index = magnitude;
    } else {
      int exponent = 63 - Long.numberOfLeadingZeros(magnitude);
      int shift = exponent - SUB_BITS;
      index = (shift + 1) * SUB + (magnitude >> shift) - SUB;
    }
    return value < 0 ? -index : index;
  }

  /** The smallest magnitude in bucket {@code |index|}. */
  public static long lower(long index) {
    long i = Math.abs(index);
    if (i < 2 * SUB) {
      return i;
    }
    long shift = i / SUB - 1;
    return (i % SUB + SUB) << shift;
  }

  /** The value a bucket stands for: its midpoint, signed as the bucket is. */
  public static long representative(long index) {
    long i = Math.abs(index);
    long width = i < 2 * SUB ? 1 : 1L << (i / SUB - 1);
    long middle = lower(i) + width / 2;
    return index < 0 ? -middle : middle;
  }
}
