"""The Faust worker runtime: the app and its topics, worker processes, metrics."""
