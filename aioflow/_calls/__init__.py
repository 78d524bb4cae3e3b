"""How a map calls user code: inline on the loop, or concurrently as tasks, threads or processes."""
