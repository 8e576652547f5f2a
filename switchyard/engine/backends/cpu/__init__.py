"""backends.cpu: the cpu backend (backend), its native C kernels (native/), the row-wise ops around them (rowops), the grammar's token masks (token_mask)."""
