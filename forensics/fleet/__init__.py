"""Fleet triage: many job folders analysed, summarised and ranked (jobs: which folders are jobs; state: the per-job
summaries and the state file; triage: the batch run)."""
