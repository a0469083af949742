"""Neural-network building blocks of the models (layers, attention, flows); the models themselves are in models/."""
