"""Matcha-TTS (text -> mel by optimal-transport conditional flow matching): Mehta, Tu, Beskow, Székely and Henter,
"Matcha-TTS: A fast TTS architecture with conditional flow matching" (ICASSP 2024), with shivammehta25/Matcha-TTS's
sizes and defaults (layers: ``modules/matcha.py``, ``modules/matcha_decoder.py``). Not registered yet: the network,
its losses and the alignment search, without a config section, data or training wiring."""
