"""Sample script for the profiler tests: shows how it is run, then exits as ``exit=CODE`` says."""

import json
import os
import sys

print(
    json.dumps(
        {
            "argv": sys.argv,
            "path0": sys.path[0],
            "name": __name__,
            "file": __file__,
            "main_is_me": sys.modules["__main__"].__dict__ is globals(),
            "dir": os.path.dirname(os.path.abspath(__file__)),
        }
    )
)
if len(sys.argv) > 1 and sys.argv[1].startswith("exit="):
    code = sys.argv[1].removeprefix("exit=")
    sys.exit(int(code) if code.isdigit() else (None if code == "none" else code))
