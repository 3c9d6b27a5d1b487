"""One run: a request validated into a plan (plan, web), prepared models measured in isolated workers
(worker, isolation, measure, memory, energy) or in the browser (web), every result committed as it
lands (recording), then the reports and the matrix (outputs)."""
