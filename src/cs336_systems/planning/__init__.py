"""Planning: what the workflow needs before any job runs, standard library only.

The config and its checks (`config`, `schema`, `knobs`, `edition`), the import graph behind each
rule's code inputs (`imports`), this machine and its GPUs (`machine`), a job's claim on its own
cards (`claim`), the progress line after each job (`eta`) and the package's one log (`log`).
The lowest floor: it imports nothing else of the package, so the workflow plans without torch.
"""
