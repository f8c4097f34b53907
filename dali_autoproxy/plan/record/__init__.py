"""Recording: what a step without a translation is called with, so that its Pillow calls, size
changes and tensor steps become ops of the plan.

It runs where a sample is drawn: in the DataLoader's workers (the main process with
``num_workers=0``). ``image``: the recording image and its recorded methods; ``image_hooks``: the
Pillow and torchvision functions that read pixels, recorded on it (installed in the workers);
``tensor``: the tensor a recorded class makes; ``tensor_hooks``: torchvision's functions recorded
on it; ``learnt``: what planning learnt of recorded transforms (``LEARNT``), one state object.
"""
