#pragma once
//! \file
//! Policy files, model descriptions and calibration files as JSON, in the vocabulary of the
//! types: a strategy (policy rules, buffers, pipeline, collectives, checkpoints), a stack with its
//! per-layer costs, a cost table. The schemas are `docs/policy.schema.json`,
//! `docs/model.schema.json` and `docs/calibration.schema.json`. This header includes one header
//! per format, `io/policy_file.hpp`, `io/model_file.hpp` and `io/calibration_file.hpp`, and the
//! JSON they share, `io/json_file.hpp`.
//!
//! Optional: it needs nlohmann/json (Debian's `nlohmann-json3-dev`, or Meson's `nlohmann_json`
//! wrap), and is not included by `<tide/tide.hpp>`, so the core stays dependency-free. Reading is
//! strict: an unknown key, an unknown slot name, a value of the wrong type or out of range throws
//! `tide::io::json_error` naming the document, the JSON path (a JSON Pointer, e.g.
//! `/rules/0/slots/1`) and what was expected.

#include <tide/io/calibration_file.hpp>
#include <tide/io/json_file.hpp>
#include <tide/io/model_file.hpp>
#include <tide/io/policy_file.hpp>
