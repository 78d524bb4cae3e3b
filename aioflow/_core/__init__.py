"""The run's core: the graph a run is built from, its channels, tasks, threads and stages."""
