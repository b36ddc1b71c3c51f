// dscpp: the one header a training program includes.
#pragma once

#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/error.h"
#include "dscpp/runtime/engine/engine.h"
