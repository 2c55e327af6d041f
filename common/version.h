/* The version of every Loom program, printed by `--version`. CMake passes
 * LOOM_VERSION from project(loom VERSION ...) in the top CMakeLists.txt; a
 * build outside CMake says "unknown". */
#ifndef LOOM_COMMON_VERSION_H
#define LOOM_COMMON_VERSION_H

#ifndef LOOM_VERSION
#define LOOM_VERSION "unknown"
#endif

#endif
