"""Neural-network building blocks shared by the example models (Tacotron2, WaveGlow)."""
