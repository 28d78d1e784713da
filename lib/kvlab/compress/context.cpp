#include "kvlab/compress/context.h"

#include "kvlab/core/check.h"

namespace kvlab {

const at::Tensor& Context::made(Entry& e) {
  if (!e.made) {
    e.value = e.make();
    e.made = true;
  }
  return e.value;
}

void Context::provide(const std::string& name, Make make, int64_t position_dim) {
  KVLAB_CHECK(make, "Context::provide('{}'): no function to make it", name);
  auto e = std::make_shared<Entry>();
  e->make = std::move(make);
  e->position_dim = position_dim;
  entries_[name] = std::move(e);
}

void Context::provide(const std::string& name, const at::Tensor& value, int64_t position_dim) {
  if (!value.defined()) {  // nothing to give: as if not provided
    entries_.erase(name);
    return;
  }
  auto e = std::make_shared<Entry>();
  e->position_dim = position_dim;
  e->made = true;
  e->value = value;
  entries_[name] = std::move(e);
}

void Context::drop(const std::string& name) { entries_.erase(name); }

bool Context::has(const std::string& name) const { return entries_.count(name) > 0; }

const at::Tensor& Context::get(const std::string& name) const {
  auto it = entries_.find(name);
  KVLAB_CHECK(it != entries_.end(), "the method reads input '{}', which this command does not give (it gives: {})",
              name, names().empty() ? "none" : fmt::format("{}", fmt::join(names(), ", ")));
  return made(*it->second);
}

Context Context::narrowed(int64_t begin, int64_t length) const {
  Context out;
  for (const auto& [name, e] : entries_) {
    if (e->position_dim < 0) {
      out.entries_[name] = e;  // shared: made once for every region
      continue;
    }
    const int64_t dim = e->position_dim;
    std::shared_ptr<Entry> whole = e;
    out.provide(
        name,
        [whole, dim, begin, length, name]() {
          const at::Tensor& w = made(*whole);
          KVLAB_CHECK(w.dim() > dim && w.size(dim) >= begin + length,
                      "input '{}' ({}) does not cover positions [{}, {}) along dimension {}", name, w.sizes(), begin,
                      begin + length, dim);
          return w.narrow(dim, begin, length);
        },
        dim);
  }
  return out;
}

std::vector<std::string> Context::names() const {
  std::vector<std::string> out;
  for (const auto& kv : entries_) out.push_back(kv.first);
  return out;
}

}  // namespace kvlab
