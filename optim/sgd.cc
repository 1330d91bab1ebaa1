#include "optim/sgd.h"

#include <cmath>
#include <map>

#include "autograd/grad_mode.h"
#include "kernels/ops.h"
#include "kernels/optim.h"
#include "optim/bf16_update.h"

namespace mg::optim {

namespace {
std::map<std::string, double> to_map(const SGDOptions& o) {
  return {{"lr", o.lr},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"weight_decay", o.weight_decay},
          {"nesterov", o.nesterov ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions defaults)
    : SGD(std::vector<ParamGroup>{{std::move(params), {}}}, defaults) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions defaults)
    : Optimizer("SGD", to_map(defaults)), fused_(defaults.fused) {
  MG_CHECK(!groups.empty(), ValueError, "SGD: got an empty list of parameter groups");
  MG_CHECK(defaults.fused || !defaults.capturable, ValueError, "SGD: capturable needs fused = true");
  capturable_ = defaults.capturable;
  for (auto& g : groups) add_param_group(std::move(g));
}

void SGD::validate(const ParamGroup& g) const {
  const double lr = g.get("lr"), mu = g.get("momentum"), tau = g.get("dampening"), wd = g.get("weight_decay");
  MG_CHECK(std::isfinite(lr) && lr >= 0.0, ValueError, "SGD: invalid learning rate: ", lr, " (must be >= 0)");
  MG_CHECK(std::isfinite(mu) && mu >= 0.0, ValueError, "SGD: invalid momentum value: ", mu, " (must be >= 0)");
  MG_CHECK(std::isfinite(wd) && wd >= 0.0, ValueError, "SGD: invalid weight_decay value: ", wd, " (must be >= 0)");
  MG_CHECK(std::isfinite(tau), ValueError, "SGD: invalid dampening value: ", tau);
  MG_CHECK(g.get("nesterov") == 0.0 || (mu > 0.0 && tau == 0.0), ValueError,
           "SGD: nesterov momentum requires a momentum > 0 and zero dampening (got momentum=", mu, ", dampening=", tau,
           ")");
  for (const char* flag : {"nesterov", "maximize"})
    MG_CHECK(g.get(flag) == 0.0 || g.get(flag) == 1.0, ValueError, "SGD: option \"", flag, "\" must be 0 or 1, got ",
             g.get(flag));
}

Optimizer::StateSpec SGD::state_spec(const std::map<std::string, double>& options, const Tensor& p) const {
  // step() keeps a buffer only with momentum (bf16 parameters: in f32); one left from a
  // momentum since set to 0 may stay.
  return {{{"momentum_buffer", options.at("momentum") != 0.0, false}},
          p.dtype() == DType::bf16 ? DType::f32 : p.dtype()};
}

void SGD::step() {
  NoGradGuard ng;
  MemoryCategoryGuard cat(MemoryCategory::OptimizerState);
  for (size_t gi = 0; gi < param_groups().size(); ++gi) {
    ParamGroup& g = param_groups()[gi];
    validate(g);  // a scheduler or the user may have edited the options since
    const double lr = g.get("lr"), mu = g.get("momentum"), tau = g.get("dampening"), wd = g.get("weight_decay");
    const bool nesterov = g.get("nesterov") != 0.0, maximize = g.get("maximize") != 0.0;
    const kernels::SGDHyper h{lr, mu, tau, wd, nesterov, maximize};
    std::map<std::pair<std::string, DType>, kernels::SGDTensors> fused;  // per (device, dtype)
    for (size_t pi = 0; pi < g.params.size(); ++pi) {
      const Tensor& p = g.params[pi];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      MG_CHECK(grad.sizes() == p.sizes() && grad.device() == p.device(), ValueError, "SGD: gradient of shape ",
               shape_str(grad.sizes()), " on ", grad.device(), " does not match parameter ", shape_str(p.sizes()),
               " on ", p.device());
      if (capturable_) check_capturable(p, grad, gi, pi);
      Tensor* buf = nullptr;
      bool first = false;
      if (mu != 0.0) {
        ParamState& st = state_for(p);
        buf = &st.buffers["momentum_buffer"];
        first = !buf->defined();
        ++st.step;
      }
      // Pure-bf16 parameter: f32 math and f32 momentum, stochastic rounding (optim/bf16_update.h).
      if (p.dtype() == DType::bf16) {
        sgd_bf16_update_(p, grad, buf, SGDStep{lr, mu, tau, wd, nesterov, maximize}, next_rounding_seed());
        continue;
      }
      const bool fusable = fused_ && kernels::multi_tensor_supported(p) && kernels::multi_tensor_supported(grad) &&
                           grad.dtype() == p.dtype() && (!buf || first || buf->dtype() == p.dtype());
      if (fusable) {
        // The kernel copies g into a fresh buffer; a capturable step may be skipped on the device,
        // and then a zero buffer makes the next step's mix (dampening 0) equal PyTorch's first step.
        if (first)
          *buf = capturable_ ? zeros(p.sizes(), {p.dtype(), p.device()}) : empty(p.sizes(), {p.dtype(), p.device()});
        kernels::SGDTensors& l = fused[{p.device().str(), p.dtype()}];
        l.params.push_back(p);
        l.grads.push_back(grad);
        if (buf) l.momentum_buffers.push_back(*buf);
        l.first_step.push_back(first ? 1 : 0);
        continue;
      }
      // Per-parameter path. d_p aliases the gradient unless something has to be combined into it.
      Tensor d_p = grad;
      if (wd != 0.0 || maximize) d_p = kernels::axpby(grad, maximize ? -1.0 : 1.0, p, wd);
      if (buf) {
        if (first) {
          *buf = raw::clone(d_p);
        } else {
          kernels::axpby_(*buf, mu, d_p, 1.0 - tau);
        }
        d_p = nesterov ? kernels::axpby(d_p, 1.0, *buf, mu) : *buf;
      }
      kernels::axpby_(p, 1.0, d_p, -lr);
    }
    for (auto& [key, l] : fused)
      kernels::sgd_multi_tensor_(l, h,
                                 capturable_ ? device_scalars(gi, l.params[0].device()) : kernels::DeviceScalars{});
  }
}

}  // namespace mg::optim
