// The timed loop's stop rule, one definition for every loop a page times (a benchmark's runs in
// runner.mjs, a generation's repeats in generate.mjs), the same rule as harness/run/measure.py (Budget):
// run until both the count (iterations) and the duration (min_duration_ms) are met, never past
// max_iterations; a time budget (`deadline`, from job.max_time_ms) stops it early, but never before
// min_iterations samples. Returns a function of the samples taken so far: null to go on, 'done', or
// 'budget' (stopped by the budget: the row's budget_stopped).
export function loopStop(job, deadline) {
  const wanted = performance.now() + job.min_duration_ms;
  const floor = Math.min(job.min_iterations, job.iterations);
  return (n) => {
    const now = performance.now();
    if (n >= job.max_iterations || (n >= job.iterations && now >= wanted)) return 'done';
    if (n >= floor && now >= deadline) return 'budget';
    return null;
  };
}
