// Anchors the precompiled LibTorch header (core/CMakeLists.txt); intentionally empty.
