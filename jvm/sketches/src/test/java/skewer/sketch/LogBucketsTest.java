package skewer.sketch;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The golden vectors Python's sketch is tested on, here for the Java one. */
class LogBucketsTest {
  private static List<String[]> vectors() throws IOException {
    Path path = Path.of(System.getProperty("skewer.vectors"), "log_buckets.tsv");
    return Files.readAllLines(path).stream()
        .filter(line -> !line.isBlank() && !line.startsWith("#"))
        .map(line -> line.split("\t"))
        .toList();
  }

  @Test
  void everyVectorsIndexLowerBoundAndRepresentativeAreJavasToo() throws IOException {
    List<String[]> rows = vectors();
    assertTrue(rows.size() > 100, "the vectors file holds " + rows.size() + " rows");
    for (String[] row : rows) {
      long value = Long.parseLong(row[0]);
      long index = Long.parseLong(row[1]);
      assertEquals(index, LogBuckets.index(value), "index of " + value);
      assertEquals(Long.parseLong(row[2]), LogBuckets.lower(index), "lower of " + index);
      assertEquals(Long.parseLong(row[3]), LogBuckets.representative(index), "middle of " + index);
    }
  }
}
