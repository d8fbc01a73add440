"""What the console shows: verbosity, the live trial table, the status view."""
