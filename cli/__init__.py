"""coordinatorctl: the operator's and author's command line."""
