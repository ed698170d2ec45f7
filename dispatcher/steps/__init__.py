"""The dispatcher's step executors (CONTRACT §3, §9), one module per kind of work, and the
table that names the executor of each step kind (:mod:`dispatcher.steps.executors`)."""
