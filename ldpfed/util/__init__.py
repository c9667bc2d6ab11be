"""The ground floor: randomness (`rng`), input errors (`errors`), compiled loops and their disk cache (`jit`),
small dense solves (`linalg`), fast normals (`normals`), progress bars (`progress`), signals (`signals`), BLAS
threads (`threads`) and memory limits (`memory`). Nothing here imports anything of ldpfed outside this folder."""
