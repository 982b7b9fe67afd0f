#include "controller/server/controller.h"

namespace wsync::controller {

Controller::Controller(const ControllerConfig& config, ControllerMetrics* metrics,
                       PlanSource* plans)
    : workers_(config, metrics),
      rendezvous_([this](const std::string& lease) { return workers_.IsAlive(lease); }),
      syncs_(config, metrics, plans, &workers_, &rendezvous_) {
  workers_.SetLossListener([this](const WorkerLoss& loss) {
    syncs_.WorkerLost(loss);
    rendezvous_.WakeAll();
  });
}

void Controller::Tick() {
  workers_.Tick();
  syncs_.Tick();
}

void Controller::Shutdown() {
  workers_.Shutdown();
  rendezvous_.Shutdown();
  syncs_.Shutdown();
}

}  // namespace wsync::controller
