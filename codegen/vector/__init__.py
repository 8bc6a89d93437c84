"""The vector path: kernels of the vector unit alone. ``schedule`` chooses the loop space, every
value's layout and the layout choices (a variant for rows too long for the UB, resident
tables), ``tiling`` the UB budget the host tiling solves, ``render`` the kernel sources;
``views``, ``decompose`` and ``phases`` rewrite what the schedule reads."""
