"""The job's facts: the JobContext and everything it derives once from the frames (identity, collectives, step
breakdown, op categories, FLOP/s, GPU metrics, NCCL setup and cost model, kernel events and fault placement, host
events, rank coverage, the run header, the job's year). Imports only base types and parsers."""
