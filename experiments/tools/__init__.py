"""Tools: checks and drills run on demand, not studies (no question of their own, no results kept).

- ``compile_check``: will a config fit a mesh's memory? Compile-only, nothing allocated.
- ``fault_drill``: kill a training run at random steps, resume it, compare with an uninterrupted run.
"""
