// The unit that dscpp_pch compiles its precompiled header with (cmake/Precompiled.cmake).
