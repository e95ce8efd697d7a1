package skewer.realtime;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * The writer builds, from the golden vectors' {@code work} rows, the ARGV the micro-batch path
 * builds (tests/apply_vectors.py says the format): the apply's payload, declared once.
 */
class ApplyArgsTest {
  private static final HexFormat HEX = HexFormat.of();

  @Test
  void everyCountsOnlyCaseGivesTheVectorsArgv() throws IOException {
    Path path = Path.of(System.getProperty("skewer.vectors"), "apply_args.tsv");
    int checked = 0;
    String[] header = null;
    List<WorkRecord> rows = new ArrayList<>();
    for (String line : Files.readAllLines(path, StandardCharsets.UTF_8)) {
      String[] parts = line.split("\t", -1);
      switch (parts[0]) {
        case "case" -> {
          header = parts;
          rows.clear();
        }
        case "row" -> rows.add(WorkRecord.decode(
            Long.parseLong(parts[1]),
            parts[2].equals("-") ? null : HEX.parseHex(parts[2]),
            HEX.parseHex(parts[3]),
            Long.parseLong(parts[4])));
        case "argv" -> {
          if (!header[7].equals("-")) {
            break;  // a query's state fields: the micro-batch path's alone
          }
          WorkBuffer buffer = new WorkBuffer(
              Integer.parseInt(header[3]), Integer.parseInt(header[4]), Long.parseLong(header[5]));
          rows.forEach(buffer::add);
          List<String> got = new ArrayList<>();
          for (byte[] item : buffer.scriptArgs(header[2], Double.parseDouble(header[6]), 0.0)) {
            got.add(HEX.formatHex(item));
          }
          List<String> expected = List.of(parts).subList(1, parts.length);
          assertEquals(expected, got, "case " + header[1]);
          checked += 1;
        }
        default -> { }
      }
    }
    assertTrue(checked >= 1, "no counts-only case in " + path);
  }
}
