// Ends the ISA target a target_<isa>.hpp began (clang's attribute scope; GCC's
// target pragma holds to the end of the translation unit).
#if defined(__clang__)
#pragma clang attribute pop
#endif
