"""The page: one module per tab, and the parts they share. Handlers live in `endpoints`."""
