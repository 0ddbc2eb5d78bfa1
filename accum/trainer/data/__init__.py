"""What each update reads: the epochs' order of examples (order), the epochs laid out as updates (timeline), a batch
cut into replica shares and micro-batches (batching), the micro-batches pulled from the input pipeline by the update
(feed, its padding cut off there), and the one dispatch from a data source to its feed (sources)."""
