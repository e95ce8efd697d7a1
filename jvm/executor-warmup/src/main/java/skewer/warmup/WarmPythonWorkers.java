package skewer.warmup;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import org.apache.spark.api.python.PythonWorker;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Starts an executor's Python daemon and forks its idle workers before the executor takes a
 * task.
 *
 * <p>Spark offers an executor tasks only once its plugins' {@code init} has returned, so a
 * replacement executor that warms here joins its first micro-batch with the daemon's modules
 * loaded and a worker per core waiting, instead of starting them inside the batch's tasks,
 * which every batch would then wait for (docs/design.md, "Spark pitfalls").
 *
 * <p>Spark keeps one daemon per (Python, worker module, daemon module, environment) and the
 * tasks find this one only when all four are exactly theirs: the driver passes the Python, the
 * modules and the task's environment as {@code spark.skewer.warmup.*} settings, and this adds
 * what each task adds on the executor itself, its local directories. A warm-up that fails is
 * logged and the executor starts cold, as without the plugin.
 */
public final class WarmPythonWorkers implements SparkPlugin {
  /** The settings' prefix; {@code env.NAME} entries are the tasks' environment. */
  public static final String PREFIX = "spark.skewer.warmup.";

  @Override
  public DriverPlugin driverPlugin() {
    return null;
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new Warmer();
  }

  /** The executor side: warms in {@code init}, before the executor takes a task. */
  static final class Warmer implements ExecutorPlugin {
    private static final Logger LOG = LoggerFactory.getLogger(WarmPythonWorkers.class);

    @Override
    public void init(PluginContext context, Map<String, String> extraConf) {
      long started = System.nanoTime();
      try {
        int workers = warm(context.conf(), SparkEnv.get());
        LOG.info(
            "warmed the Python daemon and {} idle workers in {} ms",
            workers,
            (System.nanoTime() - started) / 1_000_000);
      } catch (RuntimeException | Error error) {
        LOG.warn("the Python workers were not warmed; tasks will start them", error);
      }
    }

    private static int warm(SparkConf conf, SparkEnv env) {
      String python = conf.get(PREFIX + "python");
      String workerModule = conf.get(PREFIX + "workerModule");
      String daemonModule = conf.get(PREFIX + "daemonModule");
      int count = conf.getInt(PREFIX + "workers", 1);
      Map<String, String> environment = new HashMap<>();
      for (Tuple2<String, String> entry : conf.getAllWithPrefix(PREFIX + "env.")) {
        environment.put(entry._1(), entry._2());
      }
      List<String> localDirs = new ArrayList<>();
      for (java.io.File dir : env.blockManager().diskBlockManager().localDirs()) {
        localDirs.add(dir.getPath());
      }
      environment.put("SPARK_LOCAL_DIRS", String.join(",", localDirs));
      scala.collection.immutable.Map<String, String> key =
          scala.collection.immutable.Map$.MODULE$.from(
              CollectionConverters.asScala(Collections.unmodifiableMap(environment)));
      // Held at once, so the daemon forks one per core; then released to its idle pool.
      List<PythonWorker> forked = new ArrayList<>();
      try {
        for (int i = 0; i < count; i++) {
          forked.add(env.createPythonWorker(python, workerModule, daemonModule, key)._1());
        }
      } finally {
        for (PythonWorker worker : forked) {
          env.releasePythonWorker(python, workerModule, daemonModule, key, worker);
        }
      }
      return forked.size();
    }
  }
}
