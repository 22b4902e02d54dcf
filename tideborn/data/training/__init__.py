"""What the trainer meets: the batch-source protocol and its typed summary (`batch`), the data opened once
(`opened`), the global data order (`dataset`), the watched window (`watch`) and the worker-fed loader
(`loader`).
"""
