#include "kvlab/compress/preset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "kvlab/core/check.h"

namespace kvlab {

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"default", "paper"};
  return names;
}

void check_preset_name(const std::string& preset) {
  const auto& names = preset_names();
  KVLAB_CHECK(std::find(names.begin(), names.end(), preset) != names.end(), "--preset: unknown preset '{}'; known: {}",
              preset, fmt::join(names, ", "));
}

std::string expand_model(const std::string& text, const std::string& model) {
  // A path names the model by its file or folder (…/stories260K/ -> stories260K, x/m.gguf -> m); a
  // name keeps its dots (qwen2.5-coder-0.5b): only a weights file's extension is taken off.
  std::string trimmed = model;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const std::filesystem::path path(trimmed);
  const std::string ext = path.extension().string();
  std::string safe = ext == ".gguf" || ext == ".safetensors" ? path.stem().string() : path.filename().string();
  if (safe.empty()) safe = "model";
  std::string out = text;
  for (size_t at = out.find("{model}"); at != std::string::npos; at = out.find("{model}", at + safe.size()))
    out.replace(at, 7, safe);
  return out;
}

}  // namespace kvlab
