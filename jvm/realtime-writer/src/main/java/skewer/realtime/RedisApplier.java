package skewer.realtime;

import java.io.IOException;
import java.io.InputStream;
import java.io.Serializable;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLSocketFactory;
import javax.net.ssl.TrustManagerFactory;
import org.apache.commons.pool2.impl.GenericObjectPoolConfig;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.JedisPool;
import redis.clients.jedis.JedisSentinelPool;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisNoScriptException;
import redis.clients.jedis.util.Pool;

/**
 * The run's Redis as the writer sees it: the apply script, run with retries through a Redis
 * restart or a Sentinel failover, and behind Sentinel acknowledged by a replica ({@code WAIT})
 * before it counts as applied, as {@code StateStore.apply} does for a micro-batch.
 *
 * <p>Every name of a key and the script's text come from Python
 * (pipeline/io/redis_layout.py): this class spells none.
 */
final class RedisApplier implements Serializable {
  private static final long serialVersionUID = 1L;
  /** How long an apply keeps retrying a lost connection: longer than a failover takes. */
  static final long RETRY_MS = 60_000;
  /** How long an apply waits for a replica (pipeline/io/state_store.py REPLICA_WAIT_MS). */
  static final long REPLICA_WAIT_MS = 10_000;

  /** One pool per Redis address in each JVM (an executor runs many writers). */
  private static final Map<String, Pool<Jedis>> POOLS = new ConcurrentHashMap<>();

  private final String url;
  private final String sentinelService;
  private final String sentinels;
  private final String user;
  private final String password;
  private final int database;
  private final int replicas;
  private final String script;
  private transient byte[] scriptSha;

  /**
   * {@code sentinelService} empty: {@code url} is a plain {@code redis://} or
   * {@code rediss://} URL; else the primary that {@code sentinels} ("host:port,...") monitor
   * under that name, with {@code user}, {@code password} and {@code database} for it and for
   * the sentinels. {@code replicas}: how many must acknowledge each apply (0: no WAIT).
   */
  RedisApplier(
      String url, String sentinelService, String sentinels, String user, String password,
      int database, int replicas, String script) {
    this.url = url;
    this.sentinelService = sentinelService;
    this.sentinels = sentinels;
    this.user = user;
    this.password = password;
    this.database = database;
    this.replicas = replicas;
    this.script = script;
  }

  private Pool<Jedis> pool() {
    String address = sentinelService.isEmpty() ? url : sentinelService + "@" + sentinels + "/" + database;
    return POOLS.computeIfAbsent(address, any -> {
      GenericObjectPoolConfig<Jedis> config = new GenericObjectPoolConfig<>();
      config.setMaxTotal(64);
      config.setMaxIdle(64);
      if (sentinelService.isEmpty()) {
        URI uri = URI.create(url);
        String authority = uri.getQuery() == null ? null : caFile(uri.getQuery());
        if (authority == null) {
          return new JedisPool(config, uri);
        }
        // redis-py names the CA of a rediss:// URL in its query (?ssl_ca_certs=FILE): trust it.
        return new JedisPool(config, uri, trusting(authority), null, null);
      }
      String pass = password.isEmpty() ? null : password;
      String name = user.isEmpty() ? null : user;
      return new JedisSentinelPool(
          sentinelService, new HashSet<>(Arrays.asList(sentinels.split(","))), config, 2000, 2000,
          name, pass, database, null, 2000, 2000, name, pass, null);
    });
  }

  /** The file a URL's query names as {@code ssl_ca_certs}, or null. */
  static String caFile(String query) {
    for (String part : query.split("&")) {
      if (part.startsWith("ssl_ca_certs=")) {
        return java.net.URLDecoder.decode(
            part.substring("ssl_ca_certs=".length()), StandardCharsets.UTF_8);
      }
    }
    return null;
  }

  /** Sockets that trust the certificates of a PEM file (and no others). */
  static SSLSocketFactory trusting(String pemFile) {
    try (InputStream pem = Files.newInputStream(Paths.get(pemFile))) {
      KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
      store.load(null, null);
      int index = 0;
      for (Certificate certificate :
          CertificateFactory.getInstance("X.509").generateCertificates(pem)) {
        store.setCertificateEntry("ca-" + index++, certificate);
      }
      TrustManagerFactory trust =
          TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      trust.init(store);
      SSLContext context = SSLContext.getInstance("TLS");
      context.init(null, trust.getTrustManagers(), null);
      return context.getSocketFactory();
    } catch (IOException | GeneralSecurityException error) {
      throw new WorkerJobError("cannot read the Redis CA file " + pemFile + ": " + error);
    }
  }

  /** The values of {@code keys} (null where absent), with retries. */
  List<byte[]> get(List<String> keys) {
    return withRetries(jedis -> jedis.mget(
        keys.stream().map(k -> k.getBytes(StandardCharsets.UTF_8)).toArray(byte[][]::new)));
  }

  /** One field of a hash (null when absent), with retries. */
  byte[] hget(String key, String field) {
    return withRetries(jedis -> jedis.hget(
        key.getBytes(StandardCharsets.UTF_8), field.getBytes(StandardCharsets.UTF_8)));
  }

  /**
   * Runs the apply script with {@code args}: 1 applied now, 0 applied before, -1 when part of
   * the rows was applied before (by a writer this one replaces). Behind Sentinel it returns only
   * once a replica holds the result, re-running the (guarded) script until one does.
   */
  long apply(List<byte[]> args) {
    return withRetries(jedis -> {
      long deadline = System.currentTimeMillis() + RETRY_MS;
      while (true) {
        long result = (Long) evalsha(jedis, args);
        if (replicas == 0 || jedis.waitReplicas(replicas, REPLICA_WAIT_MS) >= replicas) {
          return result;
        }
        if (System.currentTimeMillis() > deadline) {
          throw new IllegalStateException(
              "fewer than " + replicas + " replica(s) acknowledged an apply within "
                  + RETRY_MS + " ms");
        }
      }
    });
  }

  private Object evalsha(Jedis jedis, List<byte[]> args) {
    if (scriptSha == null) {
      scriptSha = jedis.scriptLoad(script.getBytes(StandardCharsets.UTF_8));
    }
    try {
      return jedis.evalsha(scriptSha, Collections.emptyList(), args);
    } catch (JedisNoScriptException restarted) {
      scriptSha = jedis.scriptLoad(script.getBytes(StandardCharsets.UTF_8));
      return jedis.evalsha(scriptSha, Collections.emptyList(), args);
    }
  }

  private interface Call<T> {
    T run(Jedis jedis);
  }

  /** {@code call} on a pooled connection, again on a new one while Redis is unreachable. */
  private <T> T withRetries(Call<T> call) {
    long deadline = System.currentTimeMillis() + RETRY_MS;
    while (true) {
      try (Jedis jedis = pool().getResource()) {
        return call.run(jedis);
      } catch (JedisConnectionException lost) {
        if (System.currentTimeMillis() > deadline) {
          throw lost;
        }
        try {
          Thread.sleep(100);
        } catch (InterruptedException interrupted) {
          Thread.currentThread().interrupt();
          throw lost;
        }
      }
    }
  }
}
