"""core: sequences and the scheduler (decides what runs), the paged KV blocks, the output stage (sampling, masks, detokenising, stop strings, usage)."""
