// dscpp: the one header a training program includes.
#pragma once

#include "runtime/config/config_error.h"
#include "runtime/config/ds_config.h"
#include "runtime/engine/engine.h"
