import subprocess
import sys


def test_import_pipeprof_imports_no_framework_or_hardware_library():
    code = (
        "import sys, pipeprof, pipeprof.cli; "
        "heavy = [m for m in ('torch', 'tensorflow', 'pynvml', 'IPython', 'numpy') "
        "if m in sys.modules]; print(heavy); assert not heavy, heavy"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_public_api_is_small():
    import pipeprof

    assert set(pipeprof.__all__) == {
        "Bench", "Comparison", "Encodings", "Job", "Profiler", "Report", "Session", "Timer",
        "__version__", "bench", "bench_encodings", "compare", "load", "merge", "profile", "stage",
    }  # fmt: skip
    assert all(hasattr(pipeprof, name) for name in pipeprof.__all__)
