"""What the driver says happened (its events) and who listens: Ray's Callback API."""
