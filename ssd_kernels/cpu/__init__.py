"""CPU kernels in C++, built at first use with torch.utils.cpp_extension (g++, ninja) into a cache folder."""
