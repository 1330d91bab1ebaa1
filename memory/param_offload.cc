#include "memory/param_offload.h"

#include "autograd/grad_mode.h"
#include "core/cuda_memory.h"
#include "kernels/ops.h"

namespace mg::memory {

HostSource::HostSource(Device device, HostOptimizerFactory make_optimizer)
    : device_(device), make_optimizer_(std::move(make_optimizer)) {
  MG_CHECK(device.is_cuda(), DeviceError, "HostSource: parameters are fetched to a CUDA device, got ", device);
  MG_CHECK(static_cast<bool>(make_optimizer_), ValueError, "HostSource: no optimizer factory");
  stream_ = cuda::Stream::create(device.index);
}

void HostSource::adopt(size_t unit, size_t group, const UnitGroup& layout, const Tensor& values) {
  MG_CHECK(host_ == nullptr, ValueError, "HostSource: a group adopted after the first fetch");
  MG_CHECK(layout.master_dtype == DType::f32, DTypeError, "HostSource: the masters are f32, unit ", unit, " group ",
           group, " is ", layout.master_dtype);
  if (index_.size() <= unit) index_.resize(unit + 1);
  index_[unit].push_back(masters_.size());
  NoGradGuard ng;
  Tensor m = raw::to_device(values, Device::cpu());
  m.requires_grad_(true);
  masters_.push_back(m);
  dtypes_.push_back(layout.dtype);
}

HostParams& HostSource::host() {
  if (!host_) host_ = std::make_unique<HostParams>(masters_, device_, make_optimizer_, dtypes_);
  return *host_;
}

std::function<void()> HostSource::fetch(size_t unit, size_t group, const Tensor& dst) {
  HostParams& h = host();
  const size_t i = index_.at(unit).at(group);
  const cuda::Stream compute = cuda::Stream::current(device_.index);
  cuda::Event ready;  // dst's memory was the compute stream's until now
  ready.record(compute);
  ready.wait(stream_);
  {
    cuda::StreamGuard sg(stream_);
    h.copy_to_device(i, dst);
  }
  cuda::Event done;
  done.record(stream_);
  return [done, device = device_] { done.wait(cuda::Stream::current(device.index)); };
}

void HostSource::reduce(size_t unit, size_t group, Tensor grad) {
  host().add_gradient(index_.at(unit).at(group), std::move(grad));
}

void HostSource::end_backward() { host().start_round(); }

void HostSource::abandon_step() {
  host().wait();
  host().start_round();
}

ParamOffload offload_gpt_params(nn::GPT& model, Device device, HostOptimizerFactory make_optimizer, int prefetch,
                                DType compute) {
  ParamOffload out;
  out.source = std::make_shared<HostSource>(device, std::move(make_optimizer));
  ParamUnitsOptions po;
  po.device = device;
  po.prefetch = prefetch;
  po.keep = {0};
  po.dtype = nn::gpt_unit_dtype(model, compute);
  out.units = std::make_unique<ParamUnits>(nn::gpt_param_units(model), out.source, po);
  model.recompute.units = out.units.get();
  out.source->host();  // the masters pinned and the optimizer built now, not at the first step
  return out;
}

}  // namespace mg::memory
