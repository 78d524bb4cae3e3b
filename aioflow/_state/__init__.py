"""Resumable iteration: what a state holds, the logs that let a node say where it is, splits."""
