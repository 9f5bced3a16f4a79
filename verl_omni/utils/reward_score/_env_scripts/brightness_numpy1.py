"""Mean brightness computed with numpy 1.x, in the environment of the ``brightness_numpy1`` scorer.

Refuses to score under any other numpy: the scorer exists to show that its pin, which the trainer's environment
does not satisfy, is the one that runs.
"""

import numpy
from scorer_child import serve

EXPECTED_NUMPY = "1.26.4"


def mean_brightness(data, shape, prompts, targets, extra):
    if numpy.__version__ != EXPECTED_NUMPY:
        raise RuntimeError(f"numpy {numpy.__version__} runs here, the environment pins {EXPECTED_NUMPY}")
    images = numpy.frombuffer(data, dtype=numpy.uint8).reshape(shape[0], -1)
    return (images.astype(numpy.float64).mean(axis=1) / 255.0).tolist()


if __name__ == "__main__":
    serve(mean_brightness)
