"""The admission component: starts runs (CONTRACT §9.1) behind the gateway."""
