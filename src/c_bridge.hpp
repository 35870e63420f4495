// What every C entry point shares (c_api.cpp, and the MPI layer's C ABI):
// DLTensor -> TensorView, fg_params -> Options, and the guard that turns any
// exception into a status and this thread's fg_last_error() message.
#pragma once

#include <functional>
#include <optional>

#include "flashgrad/flashgrad.h"
#include "flashgrad/flashgrad.hpp"

namespace flashgrad::c_bridge {

TensorView view(const char* fn, const char* arg, const DLTensor* t);
std::optional<TensorView> opt_view(const char* fn, const char* arg, const DLTensor* t);
Options options(const char* fn, const fg_params* p);
fg_status guarded(const std::function<void()>& f);

}  // namespace flashgrad::c_bridge
