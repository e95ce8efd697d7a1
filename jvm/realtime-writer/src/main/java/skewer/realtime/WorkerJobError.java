package skewer.realtime;

/**
 * The writer cannot go on; its message is one line for the user. Named as the Python stage's
 * error, whose name {@code worker_job.failure_reason} looks for in a failed query's trace.
 */
final class WorkerJobError extends RuntimeException {
  private static final long serialVersionUID = 1L;

  WorkerJobError(String message) {
    super(message);
  }
}
